"""Local SGD (DistributedOptimizer(sync_every=k)): periodic parameter averaging, across real processes, against a
reference written out in the job with plain torch optimizers and explicit allreduces."""

import pytest
from multiproc import run_checked

COMMON = """
import torch, torch.nn as nn, torch.nn.functional as F
import hvdlite.torch as hvd
hvd.init()
torch.set_num_threads(1)
R, N = hvd.rank(), hvd.size()

def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])

def everyone(t, what):
    return hvd.allgather(t.detach().reshape(1, -1), name="check." + what)

def same_everywhere(t, what):
    rows = everyone(t, what)
    return all(torch.equal(rows[r], rows[0]) for r in range(N))

def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))

def batch(g):
    x = torch.randn(16, 8, generator=g)
    return x, (x[:, :4] - x[:, 4:]).argmax(1)
"""


def run(script, np=2, timeout=150):
    return run_checked(COMMON + script + '\nprint("DONE", flush=True)\n', np, timeout=timeout)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("outer", ["plain", "nesterov"])
def test_local_sgd_matches_a_written_out_reference(outer):
    """Warm-up steps average gradients (weights equal on every rank after each); then each rank steps alone, the
    weights differ between averages and are equal right after each k-th step. The weights and momentum follow a
    reference that does the same with a plain optimizer, explicit allreduces and the outer Nesterov formula."""
    run(
        f"""
outer = {outer!r}
k, warmup = 3, 2
outer_lr, outer_mu = (1.0, 0.0) if outer == "plain" else (0.7, 0.5)
model, ref = make_model(), make_model()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=model.named_parameters(), sync_every=k, sync_warmup_steps=warmup,
                               outer_lr=outer_lr, outer_momentum=outer_mu, average_optimizer_state=True)
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
    torch.testing.assert_close(flat(model), flat(ref), rtol=1e-5, atol=1e-6, msg=lambda m: f"step {{step}}: {{m}}")
    momentum = torch.cat([opt.state[p]["momentum_buffer"].flatten() for p in model.parameters()])
    ref_momentum = torch.cat([ref_opt.state[p]["momentum_buffer"].flatten() for p in ref.parameters()])
    torch.testing.assert_close(momentum, ref_momentum, rtol=1e-5, atol=1e-6)
    equal = same_everywhere(flat(model), f"step{{step}}")
    assert equal == (step <= warmup or synced), (step, equal)
assert opt.local_sgd.steps == 13
"""
    )


@pytest.mark.timeout(200)
def test_local_sgd_trains_and_checks_its_arguments():
    """Averaging every 4 steps learns a small task to within 5 points of synchronous training on the same batches;
    bad settings are refused with the argument named, and elastic state commits and restores the anchor."""
    run(
        """
import pytest
from hvdlite.torch.elastic import TorchState
test_g = torch.Generator().manual_seed(99)
test_x, test_y = batch(test_g)
for _ in range(20):
    x, y = batch(test_g)
    test_x, test_y = torch.cat([test_x, x]), torch.cat([test_y, y])
accuracy = {}
for label, settings in (("synchronous", {}), ("local", dict(sync_every=4, sync_warmup_steps=10))):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=[(f"{label}.{n}", p) for n, p in model.named_parameters()],
                                   **settings)
    g = torch.Generator().manual_seed(3 + R)
    for step in range(402):  # ends on an average: 10 warm-up steps, then 98 periods of 4
        x, y = batch(g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert same_everywhere(flat(model), label)
    accuracy[label] = (model(test_x).argmax(1) == test_y).float().mean().item()
print(f"rank {R} accuracy {accuracy}", flush=True)
assert accuracy["local"] >= accuracy["synchronous"] - 0.05 and accuracy["local"] > 0.8, accuracy

model = make_model()
for settings, message in ((dict(sync_every=0), "sync_every must be an integer >= 1"),
                          (dict(sync_every=2, sync_warmup_steps=-1), "sync_warmup_steps"),
                          (dict(sync_every=2, outer_momentum=1.0), "outer_momentum"),
                          (dict(sync_every=2, op=hvd.Sum), "op=Average"),
                          (dict(sync_every=2, compression=hvd.Compression.topk()), "cannot be combined")):
    with pytest.raises(ValueError, match=message):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **settings)

opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                               sync_every=2, outer_lr=0.8, outer_momentum=0.5)
def train(steps, seed):
    g = torch.Generator().manual_seed(seed + R)
    for _ in range(steps):
        x, y = batch(g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
train(4, 0)
state = TorchState(model=model, optimizer=opt)
state.commit()
anchors = {k: v.clone() for k, v in opt.local_sgd.anchors.items()}
velocities = {k: v.clone() for k, v in opt.local_sgd.velocities.items()}
assert anchors and velocities and opt.local_sgd.steps == 4
train(3, 50)
state.restore()
assert opt.local_sgd.steps == 4
assert all(torch.equal(opt.local_sgd.anchors[k], v) for k, v in anchors.items())
assert all(torch.equal(opt.local_sgd.velocities[k], v) for k, v in velocities.items())
if R == 1:
    opt.local_sgd.anchors = {}
state.sync()
assert all(torch.equal(opt.local_sgd.anchors[k], v) for k, v in anchors.items())
train(2, 80)
assert same_everywhere(flat(model), "after sync")
"""
    )
