"""One rank of a timed allreduce (or allgather) run across hosts (bench/hierarchical.py, tests/test_multihost.py).

argv: OUT_PATH SIZES REPEATS [allreduce|allgather]. For each size in bytes (comma-separated), one warm-up
collective of a float32 buffer and then REPEATS timed ones (each waited for before the next); an allgather's size
is its output, every rank contributing an equal share. Rank 0 writes OUT_PATH as JSON: every time in seconds per
size, and the core's build info (its link cost figures included when they were measured)."""

import json
import sys
import time

import numpy as np
from numpy_collectives import allgather, allreduce

from hvdlite.common import basics

out_path, sizes, repeats = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
collective = sys.argv[4] if len(sys.argv) > 4 else "allreduce"
basics.init()


times = {}
for size in sizes:
    if collective == "allgather":
        buffer = np.ones(max(1, size // 4 // basics.size()), dtype=np.float32)
        run = allgather
    else:
        buffer = np.ones(size // 4, dtype=np.float32)
        run = allreduce
    name = f"{collective}.{size}"
    run(buffer, name)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(buffer, name)
        seconds.append(time.perf_counter() - start)
    times[str(size)] = seconds
if basics.rank() == 0:
    with open(out_path, "w") as f:
        json.dump({"size": basics.size(), "times": times, "build_info": basics.build_info()}, f)
basics.shutdown()
