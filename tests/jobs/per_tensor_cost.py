"""Per-tensor cost at few and at many tensors in flight, measured in turns in one job (argv: small K, large K,
turns): each turn times steps of K named 1 KB tensors, allreduce_async_ on each, then synchronize on each (a
DistributedOptimizer step's pattern), and rank 0 prints the large K's cost per tensor over the small K's.
Also checks every step's average."""

import statistics
import sys
import time

import torch

import hvdlite.torch as hvd

hvd.init()
torch.set_num_threads(1)
small, large, turns = (int(a) for a in sys.argv[1:4])
rank, size = hvd.rank(), hvd.size()
expected = (size + 1) / 2  # the average of 1, 2, ..., size
sets = {}
for k in (small, large):
    sets[k] = ([torch.empty(256) for _ in range(k)], [f"k{k}.grad.{i}" for i in range(k)])


def step_seconds(k):
    tensors, names = sets[k]
    for t in tensors:
        t.fill_(rank + 1)
    start = time.perf_counter()
    handles = [hvd.allreduce_async_(t, name=n) for t, n in zip(tensors, names)]
    for h in handles:
        hvd.synchronize(h)
    seconds = time.perf_counter() - start
    for t in (tensors[0], tensors[k // 2], tensors[-1]):
        assert bool((t == expected).all()), (k, t[:4].tolist(), expected)
    return seconds


def per_tensor(k, steps):
    # The mean, not the median: a cost that strikes every few steps (a full garbage collection) counts.
    return sum(step_seconds(k) for _ in range(steps)) / steps / k


for k in (small, large):  # warm-up: the first step of each negotiates every name
    per_tensor(k, 2)
ratios = []
for _ in range(turns):
    hvd.barrier()
    few = per_tensor(small, max(3, 8192 // small))
    many = per_tensor(large, max(3, 8192 // large))
    ratios.append(many / few)
    if rank == 0:
        print(f"TURN small={few * 1e6:.2f}us large={many * 1e6:.2f}us ratio={many / few:.3f}", flush=True)
if rank == 0:
    print(f"RATIO {statistics.median(ratios):.3f}", flush=True)
print("DONE", flush=True)
