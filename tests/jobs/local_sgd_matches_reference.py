"""Warm-up steps average gradients (weights equal on every rank after each); then each rank steps alone, the
weights differ between averages and are equal right after each k-th step. The weights and momentum follow a
reference that does the same with a plain optimizer, explicit allreduces and the outer Nesterov formula."""

import sys

import torch
import torch.nn.functional as F
from local_sgd_common import R, batch, flat, hvd, make_model, same_everywhere

outer = sys.argv[1]
k, warmup = 3, 2
outer_lr, outer_mu = (1.0, 0.0) if outer == "plain" else (0.7, 0.5)
model, ref = make_model(), make_model()
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
    named_parameters=model.named_parameters(),
    sync_every=k,
    sync_warmup_steps=warmup,
    outer_lr=outer_lr,
    outer_momentum=outer_mu,
    average_optimizer_state=True,
)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
anchor, velocity = None, None
g = torch.Generator().manual_seed(10 + R)
for step in range(1, 14):
    x, y = batch(g)
    for net, o in ((model, opt), (ref, ref_opt)):
        o.zero_grad()
        F.cross_entropy(net(x), y).backward()
    opt.step()
    if step <= warmup:  # the reference averages gradients by hand
        for p in ref.parameters():
            p.grad = hvd.allreduce(p.grad, name="ref.grad", op=hvd.Average)
    ref_opt.step()
    if step == warmup:
        anchor = flat(ref).clone()
    synced = step > warmup and (step - warmup) % k == 0
    if synced:
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(hvd.allreduce(p, name="ref.param", op=hvd.Average))
                buf = ref_opt.state[p]["momentum_buffer"]
                buf.copy_(hvd.allreduce(buf, name="ref.momentum", op=hvd.Average))
            if outer == "nesterov":
                averaged = flat(ref)
                outer_gradient = anchor - averaged
                velocity = outer_gradient.clone() if velocity is None else velocity * outer_mu + outer_gradient
                anchor = anchor - outer_lr * (outer_gradient + outer_mu * velocity)
                torch.nn.utils.vector_to_parameters(anchor.clone(), ref.parameters())  # views of its argument
    torch.testing.assert_close(flat(model), flat(ref), rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}: {m}")
    momentum = torch.cat([opt.state[p]["momentum_buffer"].flatten() for p in model.parameters()])
    ref_momentum = torch.cat([ref_opt.state[p]["momentum_buffer"].flatten() for p in ref.parameters()])
    torch.testing.assert_close(momentum, ref_momentum, rtol=1e-5, atol=1e-6)
    equal = same_everywhere(flat(model), f"step{step}")
    assert equal == (step <= warmup or synced), (step, equal)
assert opt.local_sgd.steps == 13
