"""One rank of bench/probes/slow_mode_logger.sh: 1500 2 MB allreduces through the core after a warm-up; rank r
prints "R<r> <median us> <the CPUs it was seen on>"."""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "jobs"))
from hvdlite.common import basics
from numpy_collectives import allreduce
basics.init()
me = basics.rank()
x = np.ones((2<<20)//4, dtype=np.float32)
for _ in range(50): allreduce(x, "w")
ts=[]
psr=[]
for _ in range(1500):  # the same count on every rank (a time limit would let one rank stop early)
    t=time.perf_counter(); allreduce(x, "b"); ts.append(time.perf_counter()-t)
    if len(ts) % 200 == 0:
        psr.append(int(open("/proc/self/stat").read().split(")")[1].split()[36]))
print("R%d %.1f %s" % (me, statistics.median(ts)*1e6, ",".join(map(str, psr[:5]))), flush=True)
basics.shutdown()
