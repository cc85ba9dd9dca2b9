"""One rank of a timed allreduce run across hosts (bench/hierarchical.py, tests/test_multihost.py).

argv: OUT_PATH SIZES REPEATS. For each size in bytes (comma-separated), one warm-up allreduce of a float32 buffer
and then REPEATS timed ones (each waited for before the next); rank 0 writes OUT_PATH as JSON: every time in
seconds per size, and the core's build info (its link cost figures included when they were measured)."""
import json
import sys
import time

import numpy as np

from hvdlite.common import basics
from numpy_collectives import allreduce

out_path, sizes, repeats = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
basics.init()


times = {}
for size in sizes:
    buffer = np.ones(size // 4, dtype=np.float32)
    name = f"allreduce.{size}"
    allreduce(buffer, name)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        allreduce(buffer, name)
        seconds.append(time.perf_counter() - start)
    times[str(size)] = seconds
if basics.rank() == 0:
    with open(out_path, "w") as f:
        json.dump({"size": basics.size(), "times": times, "build_info": basics.build_info()}, f)
basics.shutdown()
