"""One rank of bench/probes/slow_mode_logger.sh: 2 MB allreduces through the core for 1 s after a warm-up; rank r
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
t_end = time.time() + 1.0
while time.time() < t_end:
    t=time.perf_counter(); allreduce(x, "b"); ts.append(time.perf_counter()-t)
    if len(ts) % 200 == 0:
        psr.append(int(open("/proc/self/stat").read().split(")")[1].split()[36]))
print("R%d %.1f %s" % (me, statistics.median(ts)*1e6, ",".join(map(str, psr[:5]))), flush=True)
basics.shutdown()
