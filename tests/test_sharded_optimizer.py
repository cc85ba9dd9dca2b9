"""DistributedOptimizer(shard_optimizer_state=True), ZeRO stage 1, across real processes (tests/jobs/
sharded_state.py): the weights of the unsharded optimizer, each parameter's state on one rank, the consolidated
state dict's round trip through a plain torch optimizer, broadcast_optimizer_state, backward_passes_per_step and
a process set."""

import os

import pytest
from multiproc import run_job

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "sharded_state.py")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np", [2, 3])
def test_sharded_optimizer_state_matches_the_unsharded_optimizer(np):
    with open(JOB, encoding="utf-8") as f:
        result = run_job(f.read(), np=np, timeout=150)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and out.count("OK") == np, out
