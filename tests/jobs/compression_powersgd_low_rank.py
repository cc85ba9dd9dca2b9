"""M_i = u v_i^T on each rank: the average is rank 1, so one power iteration of rank 1 reproduces it, leaves
no residual over the ranks, and sends (n + m) numbers per matrix instead of n m. A vector and a matrix too
small to gain go uncompressed and arrive exactly."""

import torch
from compression_common import N, PowerSGDReducer, R, fake_params, hvd, same_everywhere

params, names = fake_params([(64, 48), (16,), (2, 2)])
reducer = PowerSGDReducer(names, hvd.global_process_set, hvd.Average, hvd, rank=1, start_iter=0)
u = torch.randn(64, generator=torch.Generator().manual_seed(1))
v = [torch.randn(48, generator=torch.Generator().manual_seed(10 + r)) for r in range(N)]
grads = [torch.outer(u, v[R]), torch.full((16,), float(R)), torch.full((2, 2), float(R + 1))]
for p, g in zip(params, grads):
    p.grad = g.clone()
reducer.reduce(params)
mean_v = torch.stack(v).mean(0)
torch.testing.assert_close(params[0].grad, torch.outer(u, mean_v), rtol=1e-4, atol=1e-4)
assert torch.equal(params[1].grad, torch.full((16,), (N - 1) / 2))
assert torch.equal(params[2].grad, torch.full((2, 2), (N + 1) / 2))
# Each rank keeps what it sent beyond the average (M_i - mean); over the ranks that is nothing.
torch.testing.assert_close(reducer.residuals["p0"], torch.outer(u, v[R] - mean_v), rtol=1e-4, atol=1e-4)
assert hvd.allreduce(reducer.residuals["p0"], name="residual").abs().max() < 1e-4
assert set(reducer.residuals) == {"p0"}  # uncompressed gradients keep no residual
assert reducer.last_sent_elements == (64 + 48) + 16 + 4 and reducer.last_dense_elements == 64 * 48 + 16 + 4
assert same_everywhere(params[0].grad, "approximation")
