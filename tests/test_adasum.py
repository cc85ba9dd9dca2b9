"""allreduce(op=Adasum) across real processes, on the built-in backend and on MPI, against a NumPy reference of
Horovod's algorithm (tests/jobs/adasum.py). The error cases (integers, non-power-of-two jobs, other collectives)
are in tests/jobs/errors.py."""

from __future__ import annotations

import pytest
from hvdjob import assert_job_ok
from multiproc import job_source, run_job

# (id, np, host_ids, launcher, env); 2 ranks run on MPI only (the algorithm is the same code over either backend's
# point-to-point calls), to keep CI under 20 minutes
CASES = [
    ("builtin-np4", 4, None, "local", {"EXPECT_BACKEND": "builtin"}),
    ("tcp-2hosts-np4", 4, [0, 1, 0, 1], "local", {"EXPECT_BACKEND": "builtin"}),
    ("mpi-np2", 2, None, "mpi", {"EXPECT_BACKEND": "mpi"}),
    ("mpi-np4", 4, None, "mpi", {"EXPECT_BACKEND": "mpi"}),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_adasum_matches_reference(case):
    _, np, host_ids, launcher, env = case
    script = job_source("adasum")
    result = run_job(script, np=np, host_ids=host_ids, env=env, timeout=120, launcher=launcher)
    assert_job_ok(result, np, min_count=60)
