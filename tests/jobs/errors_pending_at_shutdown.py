"""An operation pending when shutdown() runs fails with AbortedError instead of hanging or losing its handle."""

import torch
from hvdjob import expect_raises

import hvdlite.torch as hvd

hvd.init()
me = hvd.rank()
h = None
if me == 0:
    h = hvd.allreduce_async(torch.ones(3), name="never.completed")  # rank 1 never submits it
# Only then may rank 1 shut down: with the barrier first, a rank 0 descheduled after it found hvdlite already
# stopped by rank 1 and its enqueue failed instead (seen once in a full run).
hvd.barrier()
hvd.shutdown()
if me == 0:
    expect_raises("operation pending at shutdown", hvd.AbortedError, hvd.synchronize, h, match=["shut down"])
print("OK 1", flush=True)
