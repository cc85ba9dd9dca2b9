"""A parameter unused on some ranks in a step does not hang the exchange: its gradient is averaged with zeros
where it had none. One unused on every rank keeps no gradient, as under DDP, so that momentum and weight decay
leave it alone as they do in a single process."""

import torch
import torch.nn as nn
from training_common import N, R, assert_same_everywhere, hvd

LR, DECAY = 1.0, 0.1


class ThreeHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 4)
        self.heads = nn.ModuleList(nn.Linear(4, 1) for _ in range(3))

    def forward(self, x, head):
        return self.heads[head](self.body(x))


model = ThreeHeads()
sgd = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=DECAY)
opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
x = torch.ones(2, 4)
# Step 1: head 1 is used on rank 0 only, head 2 on no rank. Step 2: head 2 on rank N - 1 only, head 1 on none.
for step, (used_by, unused) in enumerate([((1, 0), 2), ((2, N - 1), 1)]):
    head, user = used_by
    others = [h for h in range(3) if h not in (head, unused)]
    before = [p.detach().clone() for p in model.heads[head].parameters()]
    idle = [p.detach().clone() for p in model.heads[unused].parameters()]
    g = [t.detach() for t in torch.autograd.grad(model(x, head).sum(), list(model.heads[head].parameters()))]
    opt.zero_grad()
    model(x, head if R == user else others[0]).sum().backward()
    opt.step()
    assert_same_everywhere(model, f"unused.{step}")
    for p in model.heads[unused].parameters():
        assert p.grad is None, f"step {step}: head {unused}, used on no rank, got a gradient"
    for p, was in zip(model.heads[unused].parameters(), idle):
        assert torch.equal(p.detach(), was), f"step {step}: head {unused}, used on no rank, moved"
    if step == 0:  # (the first step of momentum SGD: the update is the gradient with weight decay added)
        for p, was, mine in zip(model.heads[head].parameters(), before, g):
            expected = was - LR * (mine / N + DECAY * was)  # rank `user`'s gradient averaged with zeros
            assert torch.allclose(p.detach(), expected, atol=1e-6), (step, p, expected)
            assert p.grad is not None
