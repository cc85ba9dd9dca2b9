"""One rank of bench/probes/slow_mode_logger.sh: 1500 2 MB allreduces through the core after a warm-up, and an
in-process 2 MB memcpy of the same buffer before and after; rank r prints "R<r> <allreduce median us> <CPUs it
was seen on> memcpy <GB/s before>/<after>". A slow run whose memcpy is fast points at the cross-process path; a
slow memcpy too would point at where the process's memory landed."""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "jobs"))
from hvdlite.common import basics  # noqa: E402
from numpy_collectives import allreduce  # noqa: E402


def memcpy_gbytes_per_s(src, dst):
    times = []
    for _ in range(200):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return src.nbytes / statistics.median(times) / 1e9


basics.init()
me = basics.rank()
x = np.ones((2 << 20) // 4, dtype=np.float32)
y = np.empty_like(x)
before = memcpy_gbytes_per_s(x, y)
for _ in range(50):
    allreduce(x, "w")
times, cpus = [], []
for i in range(1500):  # the same count on every rank (a time limit would let one rank stop early)
    start = time.perf_counter()
    allreduce(x, "b")
    times.append(time.perf_counter() - start)
    if i % 300 == 0:
        cpus.append(int(open("/proc/self/stat").read().split(")")[1].split()[36]))
after = memcpy_gbytes_per_s(x, y)
print("R%d %.1f %s memcpy %.1f/%.1f" % (me, statistics.median(times) * 1e6, ",".join(map(str, cpus)), before, after),
      flush=True)
basics.shutdown()
