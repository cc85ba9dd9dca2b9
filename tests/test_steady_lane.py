"""The steady lane: a synchronous allreduce of a cached small tensor runs as one exchange on the caller's thread
(hvdlite_core/src/runtime/steady_lane.cc). Its results, its hand-over to a cycle, a mismatch met in it, and a peer
that dies while the others wait in it."""

from __future__ import annotations

import pytest
from hvdjob import assert_job_ok, ok_ranks
from multiproc import job_source, run_job

LANE_CASES = [
    ("shm-np2", 2, None),
    ("shm-np3", 3, None),
    ("tcp-2hosts-np3", 3, [0, 1, 0]),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", LANE_CASES, ids=[c[0] for c in LANE_CASES])
def test_steady_lane_results_hand_over_and_mismatch(case):
    _, np, host_ids = case
    rounds = 40
    result = run_job(job_source("steady_lane"), np=np, host_ids=host_ids, args=[str(rounds)], timeout=100)
    assert_job_ok(result, np, min_count=3 + 10 * rounds + 1 + 2 * rounds + 1 + 6)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("np", [2, 3])
def test_peer_death_in_the_steady_lane(np):
    result = run_job(
        job_source("steady_lane_peer_death"), np=np, env={"HVDLITE_PEER_TIMEOUT_SECONDS": "10"}, timeout=40
    )
    info = f"exit code {result.returncode}\n--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n"
    info += result.stderr[-4000:]
    assert result.returncode == 7, "the starter must exit with the dead rank's code\n" + info
    survivors = [r for r in range(np) if r != 1]
    errors = ok_ranks(result.stdout, "PEERERR")
    assert sorted(errors) == survivors, "every surviving rank must get an error\n" + info
    for r, rest in errors.items():
        kind, elapsed, message = rest.split(" ", 2)
        assert kind in ("PeerError", "HvdliteTimeoutError"), info
        assert float(elapsed) < 10.0, f"rank {r} took {elapsed} s to notice the dead peer\n" + info
        assert "rank 1" in message, f"rank {r}: the error must name the dead rank\n" + info
        # Where this rank was: the lane's operation, which never became an entry, is among its last collectives.
        assert "allreduce 'lane.steady' (8 B, pending)" in message, f"rank {r}\n" + info
    after = ok_ranks(result.stdout, "AFTER")
    shutdown = ok_ranks(result.stdout, "SHUTDOWN")
    for r in survivors:
        assert after.get(r, "").split(" ")[0] not in ("", "no"), f"rank {r}: a collective after the failure\n" + info
        assert float(after[r].split()[1]) < 2.0, f"rank {r}: the call after the failure was slow\n" + info
        assert float(shutdown[r]) < 5.0, f"rank {r}: shutdown took {shutdown[r]} s\n" + info
