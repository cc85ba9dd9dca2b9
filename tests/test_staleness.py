"""Bounded staleness (DistributedOptimizer(staleness=s)), across real processes: the updates against a reference
written out in the job, convergence, usage errors, elastic commit and restore of the averages in flight, and the
bound itself with one rank stopped by SIGSTOP."""

import json

import pytest
from multiproc import run_job_function


def run(job, np=2, args=(), timeout=150):
    """Runs tests/jobs/<job>.py on np ranks; a failed assertion fails the test with the rank's explanation."""
    return run_job_function(job, np, args=args, timeout=timeout)


@pytest.mark.timeout(240)
def test_staleness_applies_each_average_s_steps_late_like_a_reference():
    run(
        "staleness_applies_each_average",
        timeout=220,
    )


@pytest.mark.timeout(200)
def test_a_stopped_rank_is_never_more_than_s_steps_behind(tmp_path):
    s = 2
    log = tmp_path / "steps.{rank}.jsonl"
    run(
        "staleness_stopped_rank",
        args=[str(log), str(s)],
        timeout=180,
    )
    times = {}
    for rank in (0, 1):
        for line in open(str(log).format(rank=rank)):
            event, step, when = json.loads(line)
            times[(rank, event, step)] = when
    steps = range(30)
    for rank in (0, 1):
        other = 1 - rank
        for k in steps[s + 1 :]:
            assert times[(other, "computed", k - 1 - s)] < times[(rank, "start", k)], (rank, k)
    ahead = [k for k in steps[s:] if times[(0, "start", k)] < times[(1, "computed", k - s)]]
    assert ahead, "rank 0 never got s steps ahead of the stopped rank"
    stalled = max(times[(0, "start", k + 1)] - times[(0, "start", k)] for k in steps[:-1])
    assert stalled > 1.5, f"rank 0 never waited for the stopped rank (longest step {stalled:.2f} s)"
