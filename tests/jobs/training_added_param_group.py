"""Unfreezing a layer part way through training, both ways: its parameters join the DistributedOptimizer through
add_param_group, or they were given to it frozen and are switched on with requires_grad_(True). From then on they
are averaged like the rest (the ranks' weights stay equal and match one process on the global batch). Freezing one
again stops it, momentum and weight decay included, as in one process. Where that cannot be honoured, the
optimizer says so."""

import os

import torch
import torch.nn.functional as F
from hvdjob import expect_raises
from training_common import assert_same_everywhere, data, flat, hvd, make_model, shard, step_both

during_backward = os.environ["HVDLITE_REDUCE_DURING_BACKWARD"] == "1"
model, ref = make_model(), make_model()
for m in (model, ref):
    m[2].requires_grad_(False)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model[0].parameters(), lr=0.1),
    named_parameters=model[0].named_parameters(),
    reduce_during_backward=during_backward,
)
ref_opt = torch.optim.SGD(ref[0].parameters(), lr=0.1)


def train(steps, first_step):
    for step in range(first_step, first_step + steps):
        step_both(model, opt, ref, ref_opt, step)


train(2, 0)
for m, o in ((model, opt), (ref, ref_opt)):
    m[2].requires_grad_(True)
    o.add_param_group({"params": list(m[2].parameters()), "lr": 0.05})
train(3, 2)
assert_same_everywhere(model, "after unfreezing")
assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()

# Given to the optimizer frozen, then switched on: taken in at the next step.
model, ref = make_model(seed=1), make_model(seed=1)
for m in (model, ref):
    m[2].requires_grad_(False)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1),
    named_parameters=model.named_parameters(),
    reduce_during_backward=during_backward,
)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
train(2, 10)
for m in (model, ref):
    m[2].requires_grad_(True)
train(3, 12)
assert_same_everywhere(model, "after switching a frozen layer on")
assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()

# Switched off again, with momentum: the layer stays where it is, as in one process, where a zero gradient
# averaged in its place would keep moving it.
model, ref = make_model(seed=2), make_model(seed=2)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01),
    named_parameters=model.named_parameters(),
    reduce_during_backward=during_backward,
)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
train(2, 20)
for m in (model, ref):
    m[0].requires_grad_(False)
train(2, 22)
assert model[0].weight.grad is None
for m in (model, ref):
    m[0].requires_grad_(True)
train(2, 24)
assert_same_everywhere(model, "after switching a layer off and on")
assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()

# Between backward and step the gradients in flight would miss the new group: refused.
extra = torch.nn.Parameter(torch.zeros(2))
F.cross_entropy(model(shard(data(9)[0])), shard(data(9)[1])).backward()
expect_raises(
    "add_param_group between backward and step",
    AssertionError,
    opt.add_param_group,
    {"params": [extra]},
    match=["add_param_group"],
)
opt.step()

stale = hvd.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1), staleness=1)
expect_raises(
    "add_param_group with staleness",
    NotImplementedError,
    stale.add_param_group,
    {"params": [extra]},
    match=["staleness"],
)
frozen = make_model()
frozen[2].requires_grad_(False)
stale = hvd.DistributedOptimizer(
    torch.optim.SGD(frozen.parameters(), lr=0.1), named_parameters=frozen.named_parameters(), staleness=1
)
frozen[2].requires_grad_(True)
frozen(torch.randn(2, 6)).sum().backward()
expect_raises(
    "a parameter switched on under staleness",
    NotImplementedError,
    stale.step,
    match=["'2.weight' became trainable", "staleness"],
)
