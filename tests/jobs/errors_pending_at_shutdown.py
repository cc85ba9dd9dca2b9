"""An operation pending when shutdown() runs fails with AbortedError instead of hanging or losing its handle, and
the other ranks' errors name the operations the leaving rank left pending."""

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

# A rank that leaves without waiting for its own operation: the other rank's operations, pending or submitted
# afterwards (its side of the one left behind), fail naming that operation and what to do instead.
hvd.init()
left_behind = ["rank 0 shut hvdlite down with 1 of its operations still pending (left.behind)", "synchronize"]
if me == 0:
    h = hvd.allreduce_async(torch.ones(3), name="left.behind")
    hvd.shutdown()
    expect_raises("its own operation left behind", hvd.AbortedError, hvd.synchronize, h, match=["shut down"])
else:
    # Rank 0 never submits "probe": it completes only when rank 0's shutdown stops the runtime.
    probe = hvd.allreduce_async(torch.ones(3), name="probe")
    expect_raises("pending when rank 0 left", hvd.AbortedError, hvd.synchronize, probe, match=left_behind)
    expect_raises(
        "its side of the operation left behind",
        hvd.AbortedError,
        hvd.allreduce,
        torch.ones(3),
        name="left.behind",
        match=left_behind + ["hvdlite stopped on every rank"],
    )
print("OK 2", flush=True)
