# An idle pause, then work: counts this process's voluntary context switches (every thread) during a 1 s pause
# in which no rank submits anything, then checks that work after the pause completes at once: a process set that
# leaves the last rank out (which may be in its long idle sleep), then every rank.
import time

import torch
from hvdjob import voluntary_switches

import hvdlite.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
firsts = hvd.add_process_set(list(range(size - 1)))


for step in range(3):
    hvd.allreduce_(torch.ones(4), name=f"warm.{step}")
    before = voluntary_switches()
    time.sleep(1.0)
    idle = voluntary_switches() - before
    start = time.perf_counter()
    if rank < size - 1:
        got = hvd.allreduce(torch.full((4,), float(rank)), name=f"firsts.{step}", op=hvd.Sum, process_set=firsts)
        assert got.tolist() == [float(sum(range(size - 1)))] * 4, got
    subset_s = time.perf_counter() - start
    got = hvd.allreduce(torch.ones(2), name=f"all.{step}", op=hvd.Sum)
    assert got.tolist() == [float(size)] * 2, got
    print(
        f"IDLE step={step} rank={rank} switches={idle} subset_s={subset_s:.4f} "
        f"total_s={time.perf_counter() - start:.4f}",
        flush=True,
    )
hvd.shutdown()
print("DONE", flush=True)
