"""DistributedOptimizer's gradient buckets against a one-process reference, on a model that gives them every kind
of gradient: small float32 and float64 ones (two buckets), a large one (reduced where it lies), a sparse one
(reduced on its own), a strided one (channels_last), and one that only rank 0 uses (zeros elsewhere). Midway a
parameter changes its shape in place on every rank, which the buckets' layout must notice. argv[1]: 1 to reduce
during backward, 0 to reduce everything in step(); argv[2] "dense" leaves the sparse gradient out, so that the
buckets lay out every parameter (step() then takes every gradient through them at once)."""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from hvdlite.common import binding, ops
from hvdlite.torch import gradient_buckets
from hvdlite.torch.pending_gradients import BATCHED, DEFERRED

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()
during_backward = sys.argv[1] == "1"
with_sparse = sys.argv[2:] != ["dense"]
assert size > 1


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.small = nn.Linear(6, 16)
        self.float64 = nn.Parameter(torch.randn(16, dtype=torch.float64))
        self.large = nn.Parameter(torch.randn(300, 300) * 0.05)  # 360 KB: over FUSION_TENSOR_LIMIT
        self.embedding = nn.Embedding(10, 4, sparse=True) if with_sparse else None
        self.conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        self.rank0_only = nn.Parameter(torch.randn(5))

    def loss(self, step, r):
        g = torch.Generator().manual_seed(100 * step + r)
        x = torch.randn(4, 6, generator=g)
        h = torch.tanh(self.small(x)).double() @ self.float64
        h = h.float() + (torch.randn(4, 300, generator=g) @ self.large).mean(1)
        if self.embedding is not None:
            h = h + self.embedding(torch.randint(0, 10, (4,), generator=g)).sum(1)
        image = torch.randn(4, 3, 5, 5, generator=g).to(memory_format=torch.channels_last)
        h = h + self.conv(image).mean((1, 2, 3))
        loss = F.mse_loss(h, torch.randn(4, generator=g))
        if r == 0:
            loss = loss + self.rank0_only.pow(2).sum()
        return loss


model, reference = Model(), Model()
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05),
    named_parameters=model.named_parameters(),
    reduce_during_backward=during_backward,
)
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)


def train(steps, first_step):
    for step in range(first_step, first_step + steps):
        optimizer.zero_grad()
        model.loss(step, rank).backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        (sum(reference.loss(step, r) for r in range(size)) / size).backward()  # the average of the ranks' losses
        reference_optimizer.step()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            # float32 arithmetic feeds every gradient, and the ranks sum in another order than the reference
            assert torch.allclose(p, q, atol=1e-5, rtol=1e-5), (step, name, (p - q).abs().max().item())


train(4, 0)
buckets = optimizer._hvd_buckets
assert buckets is not None, "the plain case must go through the buckets"
assert len(buckets.buckets) == 2 and {b.flat.dtype for b in buckets.buckets} == {torch.float32, torch.float64}
assert [p.shape for p in buckets.large] == [torch.Size([300, 300])], buckets.large
if with_sparse:
    assert not buckets.covers(model.embedding.weight)  # sparse: reduced on its own
else:
    assert buckets.parameter_count == len(list(model.parameters()))

# A parameter that changes its shape in place: the step that meets it reduces the misfit alone and the next step
# lays the buckets out anew.
for m in (model, reference):
    m.rank0_only.data = torch.arange(7, dtype=torch.float32)
train(3, 4)
assert optimizer._hvd_buckets is not buckets and optimizer._hvd_buckets.covers(model.rank0_only)

# The plain case in C (hvdlite/common/gradient_calls.c), where it was built: a bucket whose gradients are all there
# and contiguous is read and packed in one call (the float64 one), any other goes the Python way (the float32 one
# holds the channels_last conv's strided gradient, and on ranks but 0 lacks rank0_only's). The hook in C notes each
# gradient (for step(), or counted into its bucket during backward), leaving the Python hook a pass's first
# gradient and those outside the buckets (the large one, the sparse one).
# ABI mode (HVDLITE_CORE_LIBRARY) leaves the C calls unused, and the whole job to the Python path.
assert binding.mode == ("abi" if os.environ.get("HVDLITE_CORE_LIBRARY") else "compiled"), binding.mode
assert (ops.fast_calls is None) == (binding.mode == "abi"), binding.mode
if ops.fast_calls is not None:
    outcomes = {"taken": 0, "not": 0}

    class CountingFastCalls:
        def bucket_gradients(self, *args):
            grads = ops.fast_calls.bucket_gradients(*args)
            outcomes["taken" if grads is not None else "not"] += 1
            return grads

    gradient_buckets._fast = CountingFastCalls()
    train(2, 7)
    assert outcomes == {"taken": 2, "not": 2}, outcomes
    in_python = []
    python_hook = optimizer._hvd_on_grad
    optimizer._hvd_on_grad = lambda p: (in_python.append(p), python_hook(p))[1]
    optimizer.zero_grad()
    model.loss(9, rank).backward()
    noted = optimizer._hvd_handles
    with_gradient = [p for p in model.parameters() if p.grad is not None]
    assert set(noted) == {id(p) for p in with_gradient}, (len(noted), rank)
    bucketed = [p for p in with_gradient if id(p) in optimizer._hvd_buckets.bucket_of]
    if during_backward:
        assert all(noted[id(p)] is BATCHED for p in bucketed)
        assert len(in_python) <= 1 + len(with_gradient) - len(bucketed), (len(in_python), len(with_gradient))
        assert [b.queued for b in optimizer._hvd_buckets.buckets if b.flat.dtype == torch.float64] == [True]
    else:
        assert all(pending is DEFERRED for pending in noted.values())
        assert len(in_python) == 1, len(in_python)
    optimizer.step()
    del optimizer._hvd_on_grad
