"""TorchState.commit() keeps each rank's residuals and the shared warm-start matrices; restore() brings them
back after steps that failed to commit; sync() gives every rank rank 0's warm start and keeps its own
residuals."""

import torch
import torch.nn as nn
from compression_common import R, hvd, same_everywhere

from hvdlite.torch.elastic import TorchState

torch.manual_seed(0)
net = nn.Linear(24, 16)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(net.parameters(), lr=0.1),
    named_parameters=net.named_parameters(),
    compression=hvd.Compression.powersgd(rank=2, start_iter=0),
)


def train(steps, seed):
    for step in range(steps):
        opt.zero_grad()
        x = torch.randn(8, 24, generator=torch.Generator().manual_seed(seed + 100 * R + step))
        net(x).pow(2).mean().backward()
        opt.step()


train(3, 0)
state = TorchState(model=net, optimizer=opt, epoch=0)
state.commit()
reducer = opt.gradient_reducer
committed = reducer.state_dict()
assert committed["shared"]["iteration"] == 3 and set(committed["local"]["residuals"]) == {"weight"}
train(2, 50)
assert reducer.iteration == 5
assert not torch.equal(reducer.residuals["weight"], committed["local"]["residuals"]["weight"])
state.restore()
assert reducer.iteration == 3
assert torch.equal(reducer.residuals["weight"], committed["local"]["residuals"]["weight"])
assert torch.equal(reducer.qs["weight"], committed["shared"]["qs"]["weight"])
# A rank whose warm start went astray (as a new worker's would be) gets rank 0's at sync; residuals stay local.
if R == 1:
    reducer.qs["weight"] = torch.zeros_like(reducer.qs["weight"])
    reducer.iteration = 0
own = reducer.residuals["weight"].clone()
state.sync()
assert reducer.iteration == 3 and torch.equal(reducer.qs["weight"], committed["shared"]["qs"]["weight"])
assert torch.equal(reducer.residuals["weight"], own)
assert same_everywhere(reducer.qs["weight"], "warm start")
train(2, 80)
assert same_everywhere(net.weight, "weights after sync")
