"""What the jobs of tests/test_gradient_compression.py share: hvdlite joined with one torch thread, the reducers,
and parameters to compress. Importing it joins the job."""

import torch

import hvdlite.torch as hvd
from hvdlite.torch.gradient_reducers import PowerSGDReducer, TopKReducer  # noqa: F401 (the jobs take them from here)

hvd.init()
torch.set_num_threads(1)
R, N = hvd.rank(), hvd.size()


def same_everywhere(t, what):
    everyone = hvd.allgather(t.detach().reshape(1, -1), name="check." + what)
    return all(torch.equal(everyone[r], everyone[R]) for r in range(N))


def fake_params(shapes):
    params = [torch.zeros(shape, requires_grad=True) for shape in shapes]
    names = {id(p): f"p{i}" for i, p in enumerate(params)}
    return params, names
