"""What the jobs of tests/test_torch_horovod_compat.py share: hvdlite joined with one torch thread, every rank's
upstream gradient made alike on every rank, and a comparison that names the rank. Importing it joins the job."""

import zlib

import torch
from hvdjob import check, expect_raises  # noqa: F401 (the jobs take them from here)

import hvdlite.torch as hvd

hvd.init()
torch.set_num_threads(1)
R, N = hvd.rank(), hvd.size()
D = torch.float64


def upstream(r, key, shape):
    # Rank r's gradient flowing into a collective's output: different on every rank, so averaging and
    # summing over the ranks give different results.
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{r}".encode()))
    return torch.randn(shape, generator=g, dtype=D)


def close(what, got, expected, atol=1e-12):
    assert got is not None, f"{what}: no gradient"
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=atol), (
        f"{what} on rank {R}: got {got}, expected {expected}"
    )
