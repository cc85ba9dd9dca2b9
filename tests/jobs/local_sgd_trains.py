"""Averaging every 4 steps learns a small task to within 5 points of synchronous training on the same batches;
bad settings are refused with the argument named, and elastic state commits and restores the anchor."""

import pytest
import torch
import torch.nn.functional as F
from local_sgd_common import R, batch, flat, hvd, make_model, same_everywhere

from hvdlite.torch.elastic import TorchState

test_g = torch.Generator().manual_seed(99)
test_x, test_y = batch(test_g)
for _ in range(20):
    x, y = batch(test_g)
    test_x, test_y = torch.cat([test_x, x]), torch.cat([test_y, y])
accuracy = {}
for label, settings in (("synchronous", {}), ("local", dict(sync_every=4, sync_warmup_steps=10))):
    model = make_model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=[(f"{label}.{n}", p) for n, p in model.named_parameters()],
        **settings,
    )
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
for settings, message in (
    (dict(sync_every=0), "sync_every must be an integer >= 1"),
    (dict(sync_every=2, sync_warmup_steps=-1), "sync_warmup_steps"),
    (dict(sync_every=2, outer_momentum=1.0), "outer_momentum"),
    (dict(sync_every=2, op=hvd.Sum), "op=Average"),
    (dict(sync_every=2, compression=hvd.Compression.topk()), "cannot be combined"),
):
    with pytest.raises(ValueError, match=message):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **settings)

opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1),
    named_parameters=model.named_parameters(),
    sync_every=2,
    outer_lr=0.8,
    outer_momentum=0.5,
)


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
