"""The steady lane: a synchronous allreduce of a cached small tensor runs as one exchange on the caller's thread
(hvdlite_core/src/runtime/steady_lane.cc). Its results, its hand-over to a cycle, a mismatch met in it, its
exchanges while the cache holds an unnamed operation, and unnamed operations in it; a peer that dies while the
others wait in it is among tests/test_errors.py's peer deaths."""

from __future__ import annotations

import pytest
from hvdjob import assert_job_ok
from multiproc import job_source, run_job

# (id, np, host_ids, names cached before the job: past 128, the votes travel as windows, runtime/vote_exchange.h)
LANE_CASES = [
    ("shm-np2", 2, None, 0),
    ("shm-np3", 3, None, 0),
    ("tcp-2hosts-np3", 3, [0, 1, 0], 0),
    ("windowed-shm-np2", 2, None, 300),
    ("windowed-tcp-2hosts-np3", 3, [0, 1, 0], 300),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", LANE_CASES, ids=[c[0] for c in LANE_CASES])
def test_steady_lane_results_hand_over_and_mismatch(case):
    _, np, host_ids, prefill = case
    rounds = 40
    env = {"HVDJOB_CACHE_PREFILL": str(prefill)}
    result = run_job(job_source("steady_lane"), np=np, host_ids=host_ids, args=[str(rounds)], timeout=100, env=env)
    assert_job_ok(
        result,
        np,
        min_count=(6 + 15 * rounds + 1 + 2 * rounds + 1 + 6 + 3 * rounds + 2 * (rounds // 4) + rounds + 1)
        + (3 * rounds + 1 + rounds + rounds // 8 + 2 * rounds + 1 + 6),
    )
