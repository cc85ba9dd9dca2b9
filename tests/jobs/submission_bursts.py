# Runs of submissions on a machine whose CPUs the job's ranks fill (the job narrows itself to as many CPUs as it has
# ranks): the background thread leaves a caller's run of asynchronous submissions alone, so a step of thousands of
# per-tensor allreduces is not cut into cycles while it is being submitted; a rank that keeps submitting without
# ever waiting still answers its peer's collective within a bounded time; and short steps after a pause do not wake
# the thread each.
import os
import re
import time

import torch

size = int(os.environ["HVDLITE_SIZE"])
allowed = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, allowed[:size])  # before init: the core counts the CPUs it may use then


import hvdlite.torch as hvd  # noqa: E402
from hvdlite.common.basics import build_info  # noqa: E402

hvd.init()
rank = hvd.rank()
torch.set_num_threads(1)


def background_cycles():
    return int(re.search(r"background_cycles=(\d+)", build_info()).group(1))


assert "cpus_to_spare=0" in build_info(), build_info()

# 1. Steps of 4,096 named 1 KB allreduces, each submitted, then each synchronized: averages, so that after the first
# step every step's result is the same and nothing but the submissions runs between steps.
K, STEPS = 4096, 20
tensors = [torch.full((256,), float(rank + i % 7)) for i in range(K)]
names = [f"burst.{i}" for i in range(K)]


def step():
    handles = [hvd.allreduce_async_(t, name=n) for t, n in zip(tensors, names)]
    for h in handles:
        hvd.synchronize(h)
    for i in (0, 1, K // 2, K - 1):
        expected = (size - 1) / 2 + i % 7
        assert tensors[i][0].item() == expected, (i, tensors[i][:4], expected)


for _ in range(3):
    step()
before = background_cycles()
for _ in range(STEPS):
    step()
print(f"BURSTS rank={rank} steps={STEPS} background_cycles={background_cycles() - before}", flush=True)

# 2. Rank 0 submits one allreduce, then keeps submitting unnamed ones, never waiting, until the first has finished
# (poll does not drive progress): only its background thread's cycle can finish it, which the run of submissions
# must not put off for longer than IDLE_CYCLE_TIME at a time. Rank 1 arrives at the first one 50 ms late.
first = torch.full((4,), float(rank + 1))
extra = torch.ones(16)
if rank == 0:
    handle = hvd.allreduce_async_(first, name="first", op=hvd.Sum)
    started, pending = time.perf_counter(), []
    while not hvd.poll(handle):
        pending.append(hvd.allreduce_async(extra, op=hvd.Sum))
    waited = time.perf_counter() - started
    hvd.synchronize(handle)
else:
    time.sleep(0.05)
    hvd.allreduce_(first, name="first", op=hvd.Sum)
    waited = None
assert first[0].item() == size * (size + 1) / 2, first
count = hvd.broadcast_object(len(pending) if rank == 0 else None, root_rank=0)
if rank != 0:
    pending = [hvd.allreduce_async(extra, op=hvd.Sum) for _ in range(count)]
for h in pending:
    assert hvd.synchronize(h)[0].item() == size
if rank == 0:
    print(f"ANSWERED rank=0 seconds={waited:.4f} submitted={count}", flush=True)


# 3. A pause, in which the background thread falls into its long sleep, then a loop of short steps that the callers
# drive (a grouped allreduce of 16 small tensors): a submission wakes the long sleeper only after a pause, not at
# every step, where each wake-up would preempt a caller.
def submission_wakes():
    return int(re.search(r"submission_wakes=(\d+)", build_info()).group(1))


SHORT_STEPS = 2000
group = [torch.full((256,), float(rank)) for _ in range(16)]
for _ in range(3):
    hvd.grouped_allreduce_(group, name="short")
time.sleep(0.2)
before = submission_wakes()
for _ in range(SHORT_STEPS):
    hvd.grouped_allreduce_(group, name="short")
assert all(t[0].item() == (size - 1) / 2 for t in group), group[0][:4]  # averages of averages stay put
print(f"SHORT rank={rank} steps={SHORT_STEPS} wakes={submission_wakes() - before}", flush=True)
hvd.shutdown()
print("DONE", flush=True)
