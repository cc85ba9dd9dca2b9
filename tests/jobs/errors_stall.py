"""Rank 0 submits a tensor no other rank ever submits: with HVDLITE_STALL_SHUTDOWN_TIME_SECONDS it fails, naming
the missing ranks, and the job goes on."""

import time

import torch
from hvdjob import check, expect_raises, synchronize_within

import hvdlite.torch as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
if me == 0:
    start = time.monotonic()
    h = hvd.allreduce_async(torch.ones(2), name="lonely")  # nobody else ever submits it
    e = expect_raises(
        "stalled tensor",
        hvd.HvdliteTimeoutError,
        synchronize_within,
        hvd,
        h,
        12,
        "allreduce 'lonely' with HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=3",
        match=["lonely", "stalled", "never submitted"] + [str(r) for r in range(1, n)],
    )
    if not isinstance(e, TimeoutError):
        raise AssertionError("HvdliteTimeoutError must be a TimeoutError")
    print(f"STALL {time.monotonic() - start:.2f}", flush=True)
else:
    time.sleep(1.5)  # then wait in the barrier: rank 0 joins it once its stalled tensor has failed (at ~3 s)
hvd.barrier()
check("after stall", hvd.allreduce(torch.ones(2), op=hvd.Sum, name="x"), torch.full((2,), float(n)))
print("OK 1", flush=True)
