# A job whose collectives are all synchronous (a step's one fused allreduce, as Keras's DistributedOptimizer makes
# it) leaves its background thread asleep: counts the background thread's own cycles over steady steps of compute
# and a 64 KB allreduce (beyond the eager region, so each is a cycle), then checks that asynchronous work after such
# a phase is still taken up at once by the background thread, while the caller computes.
import re
import time

import torch

import hvdlite.torch as hvd
from hvdlite.common.basics import build_info

hvd.init()
rank, size = hvd.rank(), hvd.size()
STEPS, COMPUTE_S, ROUNDS = 300, 0.0015, 20


def compute(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def background_cycles():
    return int(re.search(r"background_cycles=(\d+)", build_info()).group(1))


gradients = torch.ones(16384)
for step in range(STEPS // 3):
    hvd.allreduce_(gradients, name="fused", op=hvd.Sum)
    compute(COMPUTE_S)
before, start = background_cycles(), time.perf_counter()
for step in range(STEPS):
    gradients.fill_(rank + 1.0)
    hvd.allreduce_(gradients, name="fused", op=hvd.Sum)
    assert gradients[0].item() == size * (size + 1) / 2, gradients[:4]
    compute(COMPUTE_S)
sync_cycles, sync_s = background_cycles() - before, time.perf_counter() - start

# Asynchronous work after each synchronous phase: queued, then compute shorter than the long sleep; the background
# thread must have finished it by the end of the compute (the caller never waited).
late = torch.zeros(4096)
hvd.synchronize(hvd.allreduce_async_(late, name="late", op=hvd.Sum))  # negotiated once, as a step's would be
taken_up = 0
for round_ in range(ROUNDS):
    for step in range(40):
        hvd.allreduce_(gradients, name="fused", op=hvd.Sum)
        compute(COMPUTE_S)
    late = torch.full((4096,), float(rank))
    handle = hvd.allreduce_async_(late, name="late", op=hvd.Sum)
    compute(0.004)
    taken_up += hvd.poll(handle)
    hvd.synchronize(handle)
    assert late[0].item() == sum(range(size)), late[:4]
print(
    f"SYNC rank={rank} steps={STEPS} seconds={sync_s:.3f} background_cycles={sync_cycles} "
    f"taken_up={taken_up} rounds={ROUNDS}",
    flush=True,
)
hvd.shutdown()
print("DONE", flush=True)
