"""Process sets across ranks: registered at init, added/removed at runtime, overlapping sets used concurrently,
and the error cases (non-member, root outside the set, removed set, duplicate or invalid rank lists)."""

from __future__ import annotations

import pytest
from hvdjob import assert_job_ok, prelude
from multiproc import job_source, run_job

CASES = [
    ("np3", 3, None, {}),
    ("np4", 4, None, {}),
    # sets spanning both emulated hosts: members talk over TCP and shared memory
    ("tcp-2hosts-np4", 4, [0, 1, 1, 0], {}),
    ("no-cache-np4", 4, None, {"HVDLITE_CACHE_CAPACITY": "0"}),
    # 300 names cached first: the votes travel as windows, a rank outside a set voting yes at the set's positions
    ("windowed-votes-np4", 4, None, {"HVDJOB_CACHE_PREFILL": "300"}),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_process_sets(case):
    _, np, host_ids, env = case
    result = run_job(job_source("process_sets"), np=np, host_ids=host_ids, env=env, timeout=70)
    assert_job_ok(result, np, min_count=14)


@pytest.mark.timeout(90)
def test_process_sets_on_mpi():
    """Each process set is an MPI sub-communicator (MPI_Comm_split when it is added, freed when it is removed)."""
    result = run_job(job_source("process_sets"), np=4, env={"EXPECT_BACKEND": "mpi"}, timeout=70, launcher="mpi")
    assert_job_ok(result, 4, min_count=14)


TWO_RANKS = """
import torch
import hvdlite.torch as hvd
from hvdjob import check, expect_raises

even, odd = hvd.ProcessSet([0]), hvd.ProcessSet([1])
hvd.init(process_sets=[even, odd])
me = hvd.rank()
mine = even if me == 0 else odd
other = odd if me == 0 else even
assert mine.included() and not other.included() and mine.rank() == 0 and other.rank() is None
x = torch.arange(5.0) + me
# each rank alone in its set: results are its own tensor; running at the same time on both ranks
check("allreduce", hvd.allreduce(x, op=hvd.Sum, process_set=mine, name="solo"), x)
check("allgather", hvd.allgather(x, process_set=mine, name="solo.g"), x)
check("broadcast", hvd.broadcast(x, me, process_set=mine, name="solo.b"), x)
out, splits = hvd.alltoall(x, splits=[5], process_set=mine, name="solo.a")
check("alltoall", out, x)
check("alltoall splits", splits, torch.tensor([5], dtype=torch.int32))
hvd.barrier(process_set=mine)
expect_raises("collective on the other rank's set", hvd.InvalidArgumentError, hvd.allgather, x,
              process_set=other, name="other", match=["not a member"])
expect_raises("broadcast from the other rank inside my set", hvd.InvalidArgumentError, hvd.broadcast, x,
              1 - me, process_set=mine, name="root", match=["not a member"])
check("global", hvd.allreduce(x, op=hvd.Sum, name="global"), 2 * torch.arange(5.0) + 1)
print("OK 1", flush=True)
"""


@pytest.mark.timeout(60)
def test_single_rank_sets_at_init_with_two_ranks():
    result = run_job(prelude() + TWO_RANKS, np=2, timeout=40)
    assert_job_ok(result, 2)
