"""One rank of a fault-matrix trial (tests/test_fault_matrix.py): allreduce steps until something fails.

argv: OUT_DIR VICTIM FAULT [ELEMENTS]. Every rank writes its pid to OUT_DIR/pid.<rank> after init and then runs named
float32 allreduces of ELEMENTS (default 4096; numpy buffers straight through the core, so a trial costs no framework
import). With FAULT "raise" the victim raises in user code at step 40; the other faults come from the test (SIGKILL,
SIGSTOP, a link going down). A survivor whose collective fails writes OUT_DIR/error.<rank> (wall time of the failure
and the message) and exits 3."""

import json
import os
import sys
import time

import numpy as np
from numpy_collectives import allreduce

from hvdlite.common import basics, ops

out_dir, victim, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3]
elements = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
basics.init()
rank, size = basics.rank(), basics.size()
with open(os.path.join(out_dir, f"pid.{rank}"), "w") as f:
    f.write(str(os.getpid()))
buffer = np.ones(elements, dtype=np.float32)
step = 0
try:
    while True:
        if fault == "raise" and rank == victim and step == 40:
            with open(os.path.join(out_dir, "raised"), "w") as f:
                f.write(str(time.time()))
            raise RuntimeError(f"user code failed at step {step}")
        allreduce(buffer, "grad", op=ops.Average)
        step += 1
        if step == 20:
            with open(os.path.join(out_dir, f"running.{rank}"), "w") as f:
                f.write(str(time.time()))
        time.sleep(0.002)
except ops.HvdliteError as error:
    failed_at = time.time()
    with open(os.path.join(out_dir, f"error.{rank}"), "w") as f:
        json.dump({"time": failed_at, "message": str(error), "type": type(error).__name__, "step": step}, f)
    sys.exit(3)
