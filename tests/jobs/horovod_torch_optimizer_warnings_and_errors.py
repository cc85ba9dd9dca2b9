"""DistributedOptimizer warns and refuses where Horovod does, with Horovod's messages."""

import warnings

import torch
import torch.nn as nn
from horovod_torch_common import N, check, expect_raises, hvd


def model_and_opt(**kwargs):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    return model, hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), **kwargs
    )


STEP_WARNING = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code."
)
model, opt = model_and_opt()
model(torch.ones(1, 3)).sum().backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.step()
assert [(w.category, str(w.message)) for w in caught] == [(UserWarning, STEP_WARNING)], caught
opt.zero_grad()
model(torch.ones(1, 3)).sum().backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
assert not caught, [str(w.message) for w in caught]

# zero_grad() with reductions in flight, or part way through accumulating backward_passes_per_step passes
model(torch.ones(1, 3)).sum().backward()
ZERO_GRAD = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition."
)
e = expect_raises("zero_grad in flight", AssertionError, opt.zero_grad)
assert str(e) == ZERO_GRAD, str(e)
opt.step()
opt.zero_grad()
model, opt = model_and_opt(backward_passes_per_step=2)
model(torch.ones(1, 3)).sum().backward()
expect_raises("zero_grad mid accumulation", AssertionError, opt.zero_grad, match=["zero_grad() was called"])
model(torch.ones(1, 3)).sum().backward()
e = expect_raises("a third pass", AssertionError, lambda: model(torch.ones(1, 3)).sum().backward())
assert str(e) == (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
), str(e)
opt.step()

e = expect_raises("predivide with Sum", ValueError, model_and_opt, op=hvd.Sum, gradient_predivide_factor=2.0)
assert str(e) == "gradient_predivide_factor not supported with op != Average", str(e)
expect_raises(
    "groups=-1",
    ValueError,
    model_and_opt,
    groups=-1,
    match=["groups should be a non-negative integer or a list of list of torch.Tensor."],
)
model = nn.Linear(3, 2)
expect_raises(
    "a parameter twice",
    ValueError,
    hvd.DistributedOptimizer,
    torch.optim.SGD(model.parameters(), lr=1),
    named_parameters=model.named_parameters(),
    groups=[[model.weight], [model.weight]],
    match=["A parameter can only appear once in groups."],
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model, opt = model_and_opt(num_groups=1)  # Horovod's deprecated spelling of groups=1
assert [w.category for w in caught] == [DeprecationWarning] and "num_groups" in str(caught[0].message)
model(torch.ones(1, 3)).sum().backward()
opt.step()

# The deprecated average= argument: Horovod's warning and error
x = torch.ones(2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    check("average=False sums", hvd.allreduce(x, average=False, name="avg.false"), x * N)
assert [(w.category, str(w.message)) for w in caught] == [
    (DeprecationWarning, "Parameter `average` has been replaced with `op` and will be removed in v1.0")
]
e = expect_raises("op and average", ValueError, hvd.allreduce, x, average=True, op=hvd.Sum)
assert str(e) == "The op parameter supersedes average. Please provide only one of them.", str(e)
