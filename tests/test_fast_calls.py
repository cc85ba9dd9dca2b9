"""The per-tensor calls' steady state in C (hvdlite/common/fast_calls.c): a seeded random sequence of in-place
allreduces, synchronous and not, whose forms change under their names now and then, gives every call its result,
at 2 and 3 ranks (a process set of some of them included). Without the compiled binding (ABI mode, the manylinux
wheel's) the module is not used: tests/jobs/collectives.py checks that in its ABI-mode sweep."""

import pytest
from hvdjob import assert_job_ok
from multiproc import job_source, run_job


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np, seed", [(2, 1), (3, 2)])
def test_fast_calls_give_every_call_its_result(np, seed):
    # A long idle sleep keeps the other ranks' background threads from answering a late call's exchange in a cycle
    # of their own: the call then waits in its exchange for the late rank itself.
    env = {"HVDLITE_IDLE_CYCLE_TIME": "5000"}
    result = run_job(job_source("fast_calls"), np=np, args=["400", str(seed)], timeout=100, env=env)
    assert_job_ok(result, np, min_count=400)
