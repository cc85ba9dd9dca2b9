"""hvdlite.tensorflow across real processes: every collective eagerly and inside tf.function, their gradients,
errors, and DistributedGradientTape training against a single process on the global batch.

TensorFlow costs seconds to import per rank, so each test is ONE job (a module of tests/jobs/) that runs many
checks; every job computes its expected values itself.
"""

import pytest
from multiproc import run_job_function


def run(job, np=2, timeout=150):
    """Runs tests/jobs/<job>.py on np ranks; a failed assertion fails the test with the rank's explanation."""
    run_job_function(job, np, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.timeout(240)
def test_collectives_eager_and_in_tf_function():
    run(
        "tf_collectives",
        np=3,
    )


@pytest.mark.timeout(240)
def test_collective_gradients_errors_and_xla():
    run("tf_gradients_errors_xla")


@pytest.mark.timeout(240)
def test_distributed_gradient_tape_matches_single_process():
    run("tf_gradient_tape")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("np", [2, 3])
def test_independent_collectives_in_one_graph_run(np):
    run(
        "tf_independent_collectives",
        np=np,
    )


@pytest.mark.timeout(240)
def test_graph_error_classes_indexed_slices_and_graph_gradients():
    run("tf_graph_errors_and_gradients")


@pytest.mark.timeout(200)
def test_tf1_graph_mode_session_hook_and_v1_optimizer():
    run("tf_v1_session", np=2)


def test_tf_function_error_classes_single_process():
    run("tf_error_classes", np=1, timeout=120)


@pytest.mark.timeout(200)
def test_call_sites_follow_new_buffers_and_shapes():
    run("tf_call_sites")


@pytest.mark.timeout(240)
def test_grouped_allreduces_travel_packed_and_fail_naming_the_member():
    # 3 ranks: errors group the ranks that agree ("ranks 1, 2") and name one alone ("rank 0").
    run("tf_packed_groups", np=3)
