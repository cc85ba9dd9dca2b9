"""A model trained by one DistributedOptimizer, then by a new one over the same parameters (a new learning rate, a
trial after a trial in one process): the newer optimizer alone reduces the gradients, whether the earlier one is
still referenced or dropped, and a dropped one is freed with what it holds instead of staying alive through its
gradient hooks. Reducing during backward, where a stale hook would submit a second collective under each name."""

import gc
import weakref

import torch
from training_common import assert_same_everywhere, flat, hvd, make_model, step_both

model, ref = make_model(), make_model()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)


def distributed(lr):
    return hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr),
        named_parameters=model.named_parameters(),
        reduce_during_backward=True,
    )


def train(opt, steps, lr, first_step):
    for group in ref_opt.param_groups:
        group["lr"] = lr
    for step in range(first_step, first_step + steps):
        step_both(model, opt, ref, ref_opt, step)


first = distributed(0.1)
train(first, 2, 0.1, 0)
kept = first  # still referenced while the next optimizer trains
second = distributed(0.05)
train(second, 2, 0.05, 2)
assert_same_everywhere(model, "after the second optimizer")
assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()

dropped = weakref.ref(first)
del first, kept
third = distributed(0.02)
gc.collect()
assert dropped() is None, "a discarded DistributedOptimizer is still alive"
train(third, 2, 0.02, 4)
assert_same_everywhere(model, "after the third optimizer")
assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()

# Dropping the optimizer with its model frees both (and the model's parameters) once collected.
other = make_model(seed=1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), named_parameters=other.named_parameters())
other(torch.randn(2, 6)).sum().backward()
opt.step()
watched = [weakref.ref(opt), weakref.ref(next(other.parameters()))]
del opt, other
gc.collect()
assert all(w() is None for w in watched), "a dropped model and its DistributedOptimizer are still alive"
