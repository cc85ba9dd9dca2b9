"""What the jobs of tests/test_staleness.py share: hvdlite joined with one torch thread, a small model, each rank's
batches, and a check that every rank holds the same values. Importing it joins the job."""

import torch
import torch.nn as nn

import hvdlite.torch as hvd

hvd.init()
torch.set_num_threads(1)
R, N = hvd.rank(), hvd.size()


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def same_everywhere(t, what):
    rows = hvd.allgather(t.detach().reshape(1, -1), name="check." + what)
    return all(torch.equal(rows[r], rows[0]) for r in range(N))


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 8, generator=g)
    return x, (x[:, :4] - x[:, 4:]).argmax(1)
