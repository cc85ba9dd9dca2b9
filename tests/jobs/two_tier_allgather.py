"""One rank of tests/test_multihost.py's hierarchical allgather check: allgathers of int32 rows (a different number
of rows on every rank), results saved to OUT_DIR/<label>.<rank>.npy.

argv: OUT_DIR LABEL ROWS REPEATS. Rank r contributes ROWS + r rows of 256 int32 seeded by rank, so runs with
HVDLITE_HIERARCHICAL_ALLGATHER=0 and =1 can be compared; REPEATS more allgathers follow, to move enough bytes
for the test to count them on the host's link."""

import os
import sys

import numpy as np
from numpy_collectives import allgather

from hvdlite.common import basics

out_dir, label, rows, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
basics.init()
rank = basics.rank()
data = np.random.default_rng(200 + rank).integers(-1000, 1000, (rows + rank, 256), dtype=np.int32)
result = allgather(data, "rows")
for i in range(repeats):
    again = allgather(data, f"repeat{i}")
    assert np.array_equal(again, result)
np.save(os.path.join(out_dir, f"{label}.{rank}.npy"), result)
basics.shutdown()
