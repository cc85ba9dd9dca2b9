"""Four allreduces in flight together and an allgather, for the timeline test to find negotiation and fused
execution in the file."""

import torch

import hvdlite.torch as hvd

hvd.init()
handles = [hvd.allreduce_async(torch.ones(10) * i, name=f"grad.{i}") for i in range(4)]
for h in handles:
    hvd.synchronize(h)
hvd.allgather(torch.ones(2, 2), name="gathered")
hvd.shutdown()
