"""Over many steps of random full-rank gradients, what the ranks applied plus their mean residual is the sum of
the true averaged gradients, for PowerSGD and top-k: compression delays what it drops, it loses nothing. The
applied updates are the same on every rank."""

import torch
from compression_common import PowerSGDReducer, R, TopKReducer, fake_params, hvd, same_everywhere

for kind in ("powersgd", "topk"):
    params, names = fake_params([(40, 30), (8, 4, 3, 3), (30,)])
    if kind == "powersgd":
        reducer = PowerSGDReducer(names, hvd.global_process_set, hvd.Average, hvd, rank=2, start_iter=2)
    else:
        reducer = TopKReducer(names, hvd.global_process_set, hvd.Average, hvd, ratio=0.05, start_iter=2)
    applied = [torch.zeros_like(p) for p in params]
    true_sum = [torch.zeros_like(p) for p in params]
    g = torch.Generator().manual_seed(100 + R)
    for step in range(12):
        grads = [torch.randn(p.shape, generator=g) for p in params]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        everyone = [hvd.allreduce(grad, name=f"true.{i}", op=hvd.Average) for i, grad in enumerate(grads)]
        reducer.reduce(params)
        for a, t, p, mean in zip(applied, true_sum, params, everyone):
            a += p.grad
            t += mean
            assert same_everywhere(p.grad, "applied"), (kind, step)
        if step >= 2:  # compressing now: fewer numbers sent than the dense gradients hold
            assert reducer.last_sent_elements * 2 <= reducer.last_dense_elements, (kind, reducer.last_sent_elements)
    for i, (a, t, p) in enumerate(zip(applied, true_sum, params)):
        residual = reducer.residuals.get(f"p{i}", torch.zeros_like(p))
        mean_residual = hvd.allreduce(residual, name=f"residual.{i}", op=hvd.Average)
        torch.testing.assert_close(a + mean_residual, t, rtol=1e-4, atol=1e-4)
        if i < 2:
            assert residual.abs().sum() > 0, f"{kind}: a compressed gradient kept no residual"
