"""hvdlite.torch behaves as horovod.torch where scripts can tell, across real processes: alltoall's return
forms, the gradients of (grouped) differentiable collectives, sparse gradients and sparse_allreduce_async,
broadcast_optimizer_state with parameters that never had a gradient, DistributedOptimizer's warnings and usage
errors, and behaviour pins (default op, unnamed ops, process_set everywhere, broadcast_object, gradient
accumulation, op=Sum and gradient_predivide_factor). Horovod's reference behaviour is quoted where it is
checked.
"""

import pytest
from multiproc import run_job_function


def run(job, np=2, timeout=150):
    """Runs tests/jobs/<job>.py on np ranks; a failed assertion fails the test with the rank's explanation."""
    run_job_function(job, np, timeout=timeout)


@pytest.mark.timeout(200)
def test_alltoall_returns_the_tensor_unless_splits_are_given():
    run(
        "horovod_torch_alltoall",
        np=3,
    )


@pytest.mark.timeout(200)
def test_collective_gradients_follow_horovod():
    run(
        "horovod_torch_collective_gradients",
        np=3,
    )


@pytest.mark.timeout(200)
def test_grouped_collectives_are_differentiable():
    run(
        "horovod_torch_grouped_gradients",
        np=3,
    )


@pytest.mark.timeout(200)
def test_sparse_gradients_reach_sparse_adam_sparse():
    run("horovod_torch_sparse_gradients")


@pytest.mark.timeout(200)
def test_broadcast_optimizer_state_with_parameters_that_never_had_a_gradient():
    run("horovod_torch_optimizer_state_without_gradients")


@pytest.mark.timeout(200)
def test_distributed_optimizer_warnings_and_usage_errors_match_horovod():
    run("horovod_torch_optimizer_warnings_and_errors")


@pytest.mark.timeout(300)
def test_behaviour_pins():
    run(
        "horovod_torch_behaviour_pins",
        np=3,
        timeout=200,
    )
