"""Four allreduces in flight together, an allgather, and a run of small unnamed allreduces, for the timeline test
to find negotiation, fused execution and cached (eager) execution in the file."""

import torch

import hvdlite.torch as hvd

UNNAMED_STEPS = 10
hvd.init()
handles = [hvd.allreduce_async(torch.ones(10) * i, name=f"grad.{i}") for i in range(4)]
for h in handles:
    hvd.synchronize(h)
hvd.allgather(torch.ones(2, 2), name="gathered")
for step in range(UNNAMED_STEPS):
    assert hvd.allreduce(torch.full((2,), float(step)), op=hvd.Sum).tolist() == [2.0 * step] * 2
hvd.shutdown()
