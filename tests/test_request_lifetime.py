"""A request handed to the core lives until the core has copied it. Named requests stay in the binding's cache;
unnamed ones and those with splits are built for one call, and their name, shape and splits buffers must outlive
the enqueue. glibc overwrites freed memory under MALLOC_PERTURB_, so a buffer freed too early reaches the core as
garbage here instead of by luck intact."""

from __future__ import annotations

import pytest
from hvdjob import assert_job_ok, prelude
from multiproc import run_job

SCRIPT = """
import torch
import hvdlite.torch as hvd
from hvdjob import check
hvd.init()
n, me = hvd.size(), hvd.rank()
for i in range(40):
    handle = hvd.allreduce_async(torch.full((3, 5), float(me)), op=hvd.Sum)  # unnamed: built for this call
    check("unnamed allreduce", hvd.synchronize(handle), torch.full((3, 5), float(sum(range(n)))), exact=False)
    splits = [1 + (me + d) % 2 for d in range(n)]
    handle = hvd.alltoall_async(torch.arange(sum(splits), dtype=torch.float32) + 100 * me, splits=splits,
                                name=f"a2a.{i}")
    out, received = hvd.synchronize(handle)
    check("alltoall with splits: received", received, torch.tensor([1 + (s + me) % 2 for s in range(n)],
                                                                    dtype=torch.int32))
print("OK 80 on rank", me, flush=True)
"""


@pytest.mark.timeout(120)
def test_uncached_requests_reach_the_core_intact():
    result = run_job(prelude() + SCRIPT, np=2, env={"MALLOC_PERTURB_": "165"}, timeout=90)
    assert_job_ok(result, 2, min_count=80)
