"""alltoall returns the tensor alone without splits and (tensor, received splits) with them, as Horovod's does, also
through alltoall_async and the differentiable path."""

import torch
from horovod_torch_common import N, R, check, hvd

x = torch.arange(3 * N * 2, dtype=torch.float32).reshape(3 * N, 2) + 100 * R
everyone = [torch.arange(3 * N * 2, dtype=torch.float32).reshape(3 * N, 2) + 100 * r for r in range(N)]
expected = torch.cat([e[3 * R : 3 * R + 3] for e in everyone])
out = hvd.alltoall(x, name="even")  # Horovod: the tensor alone without splits
assert isinstance(out, torch.Tensor), type(out)
check("alltoall without splits", out, expected)
out, received = hvd.alltoall(x, splits=[3] * N, name="listed")  # ... and (tensor, received splits) with them
check("alltoall with splits", out, expected)
check("received splits (list given: int32)", received, torch.full((N,), 3, dtype=torch.int32))
out, received = hvd.alltoall(x, splits=torch.full((N,), 3, dtype=torch.int64), name="tensor")
check("received splits keep the splits tensor's dtype", received, torch.full((N,), 3, dtype=torch.int64))
# Horovod's synchronize() on an alltoall_async handle returns (output, received_splits) in both cases.
out, received = hvd.synchronize(hvd.alltoall_async(x, name="async"))
check("alltoall_async output", out, expected)
check("alltoall_async received splits", received, torch.full((N,), 3, dtype=torch.int32))
# The differentiable path has the same return forms.
xg = x.double().requires_grad_(True)
out = hvd.alltoall(xg, name="grad.even")
assert isinstance(out, torch.Tensor) and out.grad_fn is not None
out.sum().backward()
check("alltoall gradient", xg.grad, torch.ones_like(xg))
out, received = hvd.alltoall(xg, splits=[3] * N, name="grad.split")
assert out.grad_fn is not None and not received.requires_grad
