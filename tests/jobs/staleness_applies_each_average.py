"""Step t applies the average of step t - s: the weights follow a reference that computes every rank's
gradients itself and applies their mean s steps late (op Average and Sum, s = 1 and 3), stay equal on every
rank, and drain() applies the last s. Also: training converges, a commit keeps the averages in flight (after a
restore the same steps give the same weights), and combinations that make no sense are refused."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from staleness_common import N, R, batch, flat, hvd, make_model, same_everywhere


def train_against_reference(s, op, steps=12):
    model, ref = make_model(), make_model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
        staleness=s,
        op=op,
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    queue = []
    for step in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(batch(R, step)[0]), batch(R, step)[1]).backward()
        before = flat(model)
        opt.step()
        # The reference: every rank's gradient at the reference's current weights, combined as op does.
        grads = []
        for r in range(N):
            ref_opt.zero_grad()
            F.cross_entropy(ref(batch(r, step)[0]), batch(r, step)[1]).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        combined = [sum(g[i] for g in grads) for i in range(len(grads[0]))]
        queue.append([c / N for c in combined] if op == hvd.Average else combined)
        if len(queue) > s:
            for p, g in zip(ref.parameters(), queue.pop(0)):
                p.grad = g
            ref_opt.step()
        if step < s:
            assert torch.equal(flat(model), before), f"s={s}: step {step} had nothing to apply yet"
        assert torch.allclose(flat(model), flat(ref), rtol=1e-5, atol=1e-6), (s, op, step)
        assert same_everywhere(flat(model), f"weights.{s}.{step}")
    assert opt.drain() == s and opt.drain() == 0
    for pending in queue:
        for p, g in zip(ref.parameters(), pending):
            p.grad = g
        ref_opt.step()
    assert torch.allclose(flat(model), flat(ref), rtol=1e-5, atol=1e-6), (s, op, "drained")


train_against_reference(1, hvd.Average)
train_against_reference(3, hvd.Sum)


# Convergence on a learnable task, s = 2 against synchronous training on the same batches.
def accuracy(s):
    model = make_model(1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5),
        named_parameters=model.named_parameters(),
        staleness=s,
    )
    for step in range(150):
        opt.zero_grad()
        x, y = batch(R, 100 + step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    opt.drain()
    x, y = batch(99, 0)
    return (model(x).argmax(1) == y).float().mean().item()


stale, synchronous = accuracy(2), accuracy(None)
print(f"accuracy stale={stale:.3f} synchronous={synchronous:.3f}", flush=True)
assert stale >= 0.85 and stale >= synchronous - 0.1, (stale, synchronous)

# Elastic: a commit holds the averages in flight; after a restore the same steps give the same weights.
model = make_model()
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), named_parameters=model.named_parameters(), staleness=2
)
state = hvd.elastic.TorchState(model, opt)


def steps(first, last):
    seen = []
    for step in range(first, last):
        opt.zero_grad()
        x, y = batch(R, step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        seen.append(flat(model))
    return seen


steps(0, 5)
state.commit()
assert len(opt.bounded_staleness.in_flight) == 2
first = steps(5, 9)
state.restore()
assert len(opt.bounded_staleness.in_flight) == 2
again = steps(5, 9)
assert all(torch.equal(a, b) for a, b in zip(first, again)), "the restored averages in flight differ"
# A rank may be s steps ahead of the other: it must not leave (and shut hvdlite down) before the averages it still
# owes the other rank are exchanged.
assert opt.drain() == 2

# Usage errors.
net = nn.Linear(4, 2)
for bad in (0, -1, 1.5, True):
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), staleness=bad)
        raise AssertionError(f"staleness={bad!r} was accepted")
    except ValueError as e:
        assert "staleness must be an integer >= 1" in str(e), e
for other, words in (
    (dict(sync_every=2), "sync_every"),
    (dict(compression=hvd.Compression.powersgd(rank=1)), "powersgd"),
):
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1), staleness=1, **other)
        raise AssertionError(f"staleness with {other} was accepted")
    except ValueError as e:
        assert "cannot be combined" in str(e) and words in str(e), e
