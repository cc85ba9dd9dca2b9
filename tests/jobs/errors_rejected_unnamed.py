"""A request the core rejects on one rank only does not consume an automatic name there: later unnamed collectives
still match across the ranks."""

import torch
from hvdjob import check, expect_raises, synchronize_within

import hvdlite.torch as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
if me == 0:
    # rejected by the core's argument checks (not by Python): no collective was started
    expect_raises("bad root", hvd.InvalidArgumentError, hvd.broadcast, torch.ones(2), n)
    expect_raises("bad splits", hvd.InvalidArgumentError, hvd.alltoall, torch.ones(3), splits=[1] * (n + 1))
# every rank then runs the same unnamed collectives, in the same order
h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum)
check(
    "unnamed allreduce after a rejected request on rank 0",
    synchronize_within(hvd, h, 8, "unnamed allreduce after a rejected unnamed request on rank 0"),
    torch.full((2,), float(n)),
)
h = hvd.broadcast_async(torch.full((2,), float(me)), 0)
check("unnamed broadcast", synchronize_within(hvd, h, 8, "unnamed broadcast"), torch.zeros(2))
print("OK 1", flush=True)
