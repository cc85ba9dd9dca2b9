"""DistributedOptimizer(shard_optimizer_state=True) against the same optimizer unsharded, on every rank of the job:
equal weights over 20 steps (SGD with momentum, AdamW; a learning-rate schedule; backward_passes_per_step=2), each
parameter's state on exactly one rank, the consolidated state dict equal to the unsharded one and loadable into a
plain torch optimizer and back into a sharded one, state_dict() refused before consolidation, broadcast_optimizer_
state, and a process set of some of the ranks."""

import torch
import torch.nn as nn

import hvdlite.torch as hvd
from hvdlite.common.errors import HvdliteError  # noqa: F401 - the error classes the job may meet

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()
STEPS = 20


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 24), nn.Linear(24, 4)
    )


def batch(step, r):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def pair(make, passes=1, process_set=hvd.global_process_set, tag=""):
    """(sharded model, its optimizer, unsharded model, its optimizer), the same start."""
    a, b = model(), model()
    kwargs = dict(backward_passes_per_step=passes, process_set=process_set)
    sharded = hvd.DistributedOptimizer(
        make(a.parameters()),
        [(f"s{tag}.{n}", p) for n, p in a.named_parameters()],
        shard_optimizer_state=True,
        **kwargs,
    )
    plain = hvd.DistributedOptimizer(
        make(b.parameters()), [(f"u{tag}.{n}", p) for n, p in b.named_parameters()], **kwargs
    )
    return a, sharded, b, plain


def train(net, opt, steps, passes=1, scheduler=None, ranks=None):
    ranks = list(range(size)) if ranks is None else ranks
    for step in range(steps):
        opt.zero_grad()
        for micro in range(passes):
            x, y = batch(step * passes + micro, ranks.index(rank))
            (net(x) - y).pow(2).mean().backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def same_state(a, b, what):
    assert a["param_groups"] == b["param_groups"], (what, a["param_groups"], b["param_groups"])
    assert sorted(a["state"]) == sorted(b["state"]), (what, sorted(a["state"]), sorted(b["state"]))
    for i, state in b["state"].items():
        for key, value in state.items():
            got = a["state"][i][key]
            assert torch.allclose(got, value, rtol=0, atol=1e-6) if torch.is_tensor(value) else got == value, (
                what,
                i,
                key,
            )


for kind, make in OPTIMIZERS.items():
    a, sharded, b, plain = pair(make, tag=kind)
    schedules = [torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5) for o in (sharded, plain)]
    train(a, sharded, STEPS, scheduler=schedules[0])
    train(b, plain, STEPS, scheduler=schedules[1])
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), (kind, (p - q).abs().max())

    # Every parameter's state lives on exactly one rank: the sum over the ranks is the unsharded size.
    mine, whole = sharded.optimizer_state_bytes(), plain.optimizer_state_bytes()
    everyone = hvd.allgather_object(mine, name=f"bytes.{kind}")
    assert sum(everyone) == whole and max(everyone) < whole, (kind, everyone, whole)

    try:
        sharded.state_dict()
    except RuntimeError as e:
        assert "consolidate_state_dict(to=" in str(e), e
    else:
        raise AssertionError("state_dict() of a sharded optimizer worked without consolidation")

    target = size - 1
    sharded.consolidate_state_dict(to=target)
    if rank == target:
        consolidated = sharded.state_dict()
        same_state(consolidated, plain.state_dict(), kind)
        # into a plain torch optimizer of an identical model: the same next step as the unsharded one
        c = model()
        c.load_state_dict(b.state_dict())
        alone = make(c.parameters())
        alone.load_state_dict(consolidated)
        same_state(alone.state_dict(), plain.state_dict(), f"{kind} loaded")
    # and back: a fresh sharded optimizer loads the whole state and continues as the unsharded one does
    whole_state = hvd.broadcast_object(consolidated if rank == target else None, target, name=f"whole.{kind}")
    d = model()
    d.load_state_dict(b.state_dict())
    resumed = hvd.DistributedOptimizer(
        make(d.parameters()), [(f"r.{kind}.{n}", p) for n, p in d.named_parameters()], shard_optimizer_state=True
    )
    resumed.load_state_dict(whole_state)
    assert sum(hvd.allgather_object(resumed.optimizer_state_bytes(), name=f"rb.{kind}")) == whole
    train(d, resumed, 3)
    train(b, plain, 3)
    for p, q in zip(d.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), (f"{kind} resumed", (p - q).abs().max())

    # broadcast_optimizer_state: the root's state everywhere, each rank keeping its own part
    resumed.consolidate_state_dict(to=0)
    before = resumed.state_dict() if rank == 0 else None
    hvd.broadcast_optimizer_state(resumed, root_rank=0)
    resumed.consolidate_state_dict(to=0)
    if rank == 0:
        same_state(resumed.state_dict(), before, f"{kind} broadcast")

# backward_passes_per_step=2
a, sharded, b, plain = pair(OPTIMIZERS["adamw"], passes=2, tag="passes")
train(a, sharded, 6, passes=2)
train(b, plain, 6, passes=2)
for p, q in zip(a.parameters(), b.parameters()):
    assert torch.allclose(p, q, rtol=0, atol=1e-6), ("backward_passes_per_step", (p - q).abs().max())

# A process set of some of the ranks: its members shard among themselves; the others step alone.
if size > 2:
    members = [0, size - 1]
    subset = hvd.add_process_set(members)
    a, sharded, b, plain = pair(OPTIMIZERS["sgd-momentum"], process_set=subset, tag="set")
    train(a, sharded, 5, ranks=members if rank in members else [rank])
    train(b, plain, 5, ranks=members if rank in members else [rank])
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), ("process set", (p - q).abs().max())
    if rank in members:
        share = sharded.optimizer_state_bytes()
        assert sum(hvd.allgather_object(share, name="set.bytes", process_set=subset)) == plain.optimizer_state_bytes()
    else:
        assert sharded.optimizer_state_bytes() == plain.optimizer_state_bytes()  # outside the set: all of it
    hvd.remove_process_set(subset)

# Elastic state: a commit whose consolidation fails (a peer lost mid-commit) leaves the last commit whole.
a, sharded, _, _ = pair(OPTIMIZERS["sgd-momentum"], tag="elastic")
state = hvd.elastic.TorchState(a, sharded, batches=0)
train(a, sharded, 2)
state.batches = 2
state.commit()
committed = [p.detach().clone() for p in a.parameters()]
train(a, sharded, 1)
state.batches = 3
consolidate = sharded.consolidate_state_dict
sharded.consolidate_state_dict = lambda to=0: (_ for _ in ()).throw(hvd.HorovodInternalError("a peer was lost"))
try:
    state.commit()
except hvd.HorovodInternalError:
    pass
else:
    raise AssertionError("the commit did not fail")
sharded.consolidate_state_dict = consolidate
state.restore()
assert state.batches == 2, state.batches
assert all(torch.equal(p, q) for p, q in zip(a.parameters(), committed)), "the model is not the committed one"
