"""The gradients of hvdlite.torch's differentiable collectives follow Horovod's rules: allreduce (Sum and
Average), allgather (averaged over the ranks), broadcast, and op=Sum within a process set."""

import torch
from training_common import N, R, hvd

x = (torch.arange(4, dtype=torch.float64) + R).requires_grad_(True)
w = torch.arange(4, dtype=torch.float64) + 1
(hvd.allreduce(x, op=hvd.Sum, name="g.ar") * w).sum().backward()
assert torch.equal(x.grad, w * N), x.grad  # d/dx_r sum_k w*(sum_j x_j) = N*w (each rank's w)
x.grad = None
(hvd.allreduce(x, name="g.avg") * w).sum().backward()
assert torch.allclose(x.grad, w), x.grad
rows = R + 1
a = torch.ones(rows, 2, dtype=torch.float64, requires_grad=True)
g = hvd.allgather(a, name="g.ag")
coef = torch.arange(g.shape[0] * 2, dtype=torch.float64).reshape(g.shape)
(g * coef).sum().backward()
offset = sum(r + 1 for r in range(R))
# Horovod's rule: the gathered gradient is averaged over the ranks (coef is the same everywhere), not summed
assert torch.equal(a.grad, coef[offset : offset + rows]), a.grad
b = torch.ones(3, dtype=torch.float64, requires_grad=True)
(hvd.broadcast(b, root_rank=1, name="g.bc") * 2).sum().backward()
assert torch.equal(b.grad, torch.full((3,), 2.0 if R == 1 else 0.0, dtype=torch.float64)), b.grad  # averaged
t = torch.arange(2 * N, dtype=torch.float64).requires_grad_(True)
out = hvd.alltoall(t, name="g.a2a")
(out * (torch.arange(out.numel(), dtype=torch.float64) + 1)).sum().backward()
assert t.grad.shape == t.shape and (t.grad > 0).all()
s = torch.ones(2 * N, 3, dtype=torch.float64, requires_grad=True)
piece = hvd.reducescatter(s, op=hvd.Sum, name="g.rs")
(piece * 5).sum().backward()
assert torch.equal(s.grad, torch.full_like(s, 5.0 * N)), s.grad  # Horovod: times the set size for op=Sum
