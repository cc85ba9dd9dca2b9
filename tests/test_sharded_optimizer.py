"""DistributedOptimizer(shard_optimizer_state=True), ZeRO stage 1, across real processes (tests/jobs/
sharded_state.py): the weights of the unsharded optimizer, each parameter's state on one rank, the consolidated
state dict's round trip through a plain torch optimizer, broadcast_optimizer_state, backward_passes_per_step and
a process set."""

import pytest
from multiproc import run_job_module


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np", [2, 3])
def test_sharded_optimizer_state_matches_the_unsharded_optimizer(np):
    run_job_module("sharded_state.py", np=np, timeout=150)
