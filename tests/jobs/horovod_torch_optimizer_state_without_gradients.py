"""broadcast_optimizer_state works where parameters never had a gradient (a fresh optimizer, frozen parameters), as
Horovod's does."""

import torch
import torch.nn as nn
from horovod_torch_common import N, R, expect_raises, hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.used, self.never = nn.Linear(4, 3), nn.Linear(4, 3)  # `never` gets no gradient, ever

    def forward(self, x, extra=False):
        return self.used(x) + (self.never(x) if extra else 0)


def digest(opt):
    state = opt.state_dict()
    return {
        k: {n: (v.tolist() if torch.is_tensor(v) else v) for n, v in s.items()} for k, s in state["state"].items()
    }, state["param_groups"][0]["lr"]


def batch(step):
    g = torch.Generator().manual_seed(50 + step)
    return torch.randn(N * 2, 4, generator=g)


makers = {
    "sgd-momentum": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9),
    "adam": lambda ps, lr: torch.optim.Adam(ps, lr=lr),
}
for kind, make in makers.items():
    # 1. Root trained alone on `used`; rank 1 trained both layers with another lr: after the broadcast every
    #    rank has root's state exactly (none for `never`) and root's hyper-parameters.
    model = Net()
    opt = make(model.parameters(), 0.1 if R == 0 else 0.7)
    for step in range(2):
        opt.zero_grad()
        model(torch.randn(2, 4), extra=(R != 0)).sum().backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    mine = digest(opt)
    assert hvd.allgather_object(mine, name=f"digest.{kind}") == [mine] * N, f"{kind}: states differ"
    assert set(mine[0]) == {0, 1} and mine[1] == 0.1, (kind, mine[0].keys(), mine[1])

    # 2. The usual Horovod script order with fresh optimizers (no state anywhere), then training where
    #    `never` still gets no gradient: it matches one process training on the global batch.
    model, ref = Net(), Net()
    opt = hvd.DistributedOptimizer(make(model.parameters(), 0.05), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    # as after Horovod's call (its dummy step), every parameter has a gradient, zero
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters()), kind
    ref_opt = make(ref.parameters(), 0.05)
    for step in range(3):
        x = batch(step)
        opt.zero_grad()
        model(x[R * 2 : (R + 1) * 2]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(ref(x[r * 2 : (r + 1) * 2]).pow(2).mean() for r in range(N)) / N).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (kind, name, (p - q).abs().max())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert all(torch.equal(f, flat) for f in hvd.allgather(flat.unsqueeze(0), name=f"flat.{kind}"))

lbfgs = torch.optim.LBFGS(Net().parameters())
expect_raises(
    "LBFGS", ValueError, hvd.broadcast_optimizer_state, lbfgs, 0, match=["cannot broadcast torch.optim.LBFGS state"]
)
