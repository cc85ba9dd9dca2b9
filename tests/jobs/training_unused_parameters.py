"""A parameter unused on some ranks in a step does not hang the exchange: its gradient is averaged with zeros
where it had none."""

import torch
import torch.nn as nn
from training_common import N, R, assert_same_everywhere, hvd


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head_a, self.head_b = nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x, use_b):
        h = self.body(x)
        return self.head_b(h) if use_b else self.head_a(h)


model = TwoHeads()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters())
before = model.head_b.weight.detach().clone()
x = torch.ones(2, 4)
g0 = model.body(x).detach().sum(0)  # rank 0's gradient of sum(head_b(h)) w.r.t. head_b.weight
opt.zero_grad()
model(x, use_b=(R == 0)).sum().backward()  # head_b gets a gradient on rank 0 only
opt.step()
assert_same_everywhere(model, "unused")
expected = before - 1.0 * g0 / N  # average of rank 0's gradient and zeros from the others
assert torch.allclose(model.head_b.weight.detach(), expected, atol=1e-6), (model.head_b.weight, expected)
