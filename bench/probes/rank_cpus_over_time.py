"""Where each rank's main thread runs, window by window, while it allreduces 1 MB through hvdlite.torch: 30
windows of 40 named allreduces after 20 warm-up ones; for each window, the median time (us) and the CPUs the
thread was seen on (/proc/thread-self/stat, read every 8 operations).

    hvdlite-run -np 2 python bench/probes/rank_cpus_over_time.py

Rank r prints "r <median>/<cpus> ..." for its 30 windows. Two ranks seen on the same CPU in a slow window show the
scheduler running both on one vCPU (docs/benchmarks.md, "eager small allreduces").
"""
import statistics
import time

import torch

import hvdlite.torch as hvd


def current_cpu() -> str:
    with open("/proc/thread-self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[36]  # field 39, "processor"


hvd.init()
t = torch.ones(262144)
for _ in range(20):
    hvd.allreduce_(t, name="probe.1mb", op=hvd.Sum)
windows = []
for _ in range(30):
    times, cpus = [], set()
    for i in range(40):
        start = time.perf_counter()
        hvd.allreduce_(t, name="probe.1mb", op=hvd.Sum)
        times.append(time.perf_counter() - start)
        if i % 8 == 0:
            cpus.add(current_cpu())
    windows.append("%.0f/%s" % (statistics.median(times) * 1e6, ",".join(sorted(cpus))))
print(hvd.rank(), " ".join(windows), flush=True)
