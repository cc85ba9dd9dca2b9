"""Usage errors name what is wrong; a process set of two out of three ranks compresses among itself while the
third trains alone."""

import pytest
import torch
import torch.nn as nn
from compression_common import R, hvd

for bad, message in (
    (lambda: hvd.Compression.powersgd(rank=0), "rank must be >= 1"),
    (lambda: hvd.Compression.topk(ratio=0), "ratio must be in"),
    (lambda: hvd.Compression.powersgd(start_iter=-1), "start_iter"),
    (lambda: hvd.Compression.powersgd(min_step_speedup=0.5), "min_step_speedup must be >= 1"),
    (lambda: hvd.Compression.topk(min_step_speedup=2, trial_steps=0), "trial_steps"),
):
    with pytest.raises(ValueError, match=message):
        bad()
model = nn.Embedding(10, 4, sparse=True)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression=hvd.Compression.topk(0.5))
model(torch.tensor([1, 2])).sum().backward()
with pytest.raises(ValueError, match="has a sparse one"):
    opt.step()
opt.zero_grad()
with pytest.raises(ValueError, match="gradient_predivide_factor"):
    hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        gradient_predivide_factor=2.0,
        compression=hvd.Compression.powersgd(),
    )

pair = hvd.add_process_set([0, 1])
torch.manual_seed(0)
net = nn.Linear(20, 20, bias=False)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(net.parameters(), lr=0.1),
    process_set=pair,
    compression=hvd.Compression.powersgd(rank=1, start_iter=0),
)
for step in range(3):
    opt.zero_grad()
    net(torch.randn(4, 20, generator=torch.Generator().manual_seed(R * 10 + step))).pow(2).sum().backward()
    opt.step()
weights = hvd.allgather(net.weight.detach().reshape(1, -1), name="check.pair")
assert torch.equal(weights[0], weights[1])
assert not torch.equal(weights[0], weights[2])
assert (opt.gradient_reducer.iteration == 3) == (R < 2), opt.gradient_reducer.iteration
