"""What the jobs of tests/test_local_sgd.py share: hvdlite joined with one torch thread, a small model, batches,
and checks across the ranks. Importing it joins the job."""

import torch
import torch.nn as nn

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
