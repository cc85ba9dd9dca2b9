"""init() with the MPI data plane asked for: each rank prints whether MPI is built (BUILT) and whether init
succeeded (INITIALIZED) or was refused, and why (REFUSED); with RETRY_WITH_BUILTIN it then initializes on the
built-in backend and allreduces (RETRIED)."""

import os

from hvdlite.common import basics
from hvdlite.common.build_queries import mpi_built, mpi_enabled
from hvdlite.common.errors import InvalidArgumentError

rank = int(os.environ["HVDLITE_RANK"])
if os.environ.get("RANK1_CPU_OPERATIONS") and rank == 1:
    os.environ["HVDLITE_CPU_OPERATIONS"] = os.environ["RANK1_CPU_OPERATIONS"]
print("BUILT %d %s" % (rank, mpi_built()), flush=True)
try:
    basics.init()
except InvalidArgumentError as error:
    print("REFUSED %d %s" % (rank, str(error).replace(chr(10), " ")), flush=True)
    if os.environ.get("RETRY_WITH_BUILTIN"):  # the process stays usable: init again on the built-in backend
        os.environ["HVDLITE_CPU_OPERATIONS"] = "builtin"
        basics.init()
        import numpy as np
        from numpy_collectives import allreduce

        print("RETRIED %d %s" % (rank, allreduce(np.ones(3, dtype=np.float32), "after").tolist()), flush=True)
else:
    print("INITIALIZED %d enabled=%s" % (rank, mpi_enabled()), flush=True)
