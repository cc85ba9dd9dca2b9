"""What the jobs of tests/test_torch_training.py share: hvdlite joined with one torch thread, a small model, the
global batch of a step and this rank's shard of it, and a check that every rank holds the same weights. Importing
it joins the job."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd

hvd.init()
torch.set_num_threads(1)
R, N = hvd.rank(), hvd.size()


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def data(step, rows_per_rank=4):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(N * rows_per_rank, 6, generator=g)
    y = torch.randint(0, 3, (N * rows_per_rank,), generator=g)
    return x, y


def shard(t, rows_per_rank=4):
    return t[R * rows_per_rank : (R + 1) * rows_per_rank]


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def assert_same_everywhere(model, what):
    w = flat(model)
    everyone = hvd.allgather(w.unsqueeze(0), name="check." + what)
    for r in range(N):
        assert torch.equal(everyone[r], w), f"{what}: rank {r} differs from rank {R}"


def step_both(model, opt, ref, ref_opt, step):
    """One step of the distributed model on this rank's shard of step's batch and of the single-process reference
    on the whole of it."""
    x, y = data(step)
    opt.zero_grad()
    F.cross_entropy(model(shard(x)), shard(y)).backward()
    opt.step()
    ref_opt.zero_grad()
    F.cross_entropy(ref(x), y).backward()
    ref_opt.step()
