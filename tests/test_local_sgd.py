"""Local SGD (DistributedOptimizer(sync_every=k)): periodic parameter averaging, across real processes, against a
reference written out in the job with plain torch optimizers and explicit allreduces."""

import pytest
from multiproc import run_job_function


def run(job, np=2, args=(), timeout=150):
    """Runs tests/jobs/<job>.py on np ranks; a failed assertion fails the test with the rank's explanation."""
    return run_job_function(job, np, args=args, timeout=timeout)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("outer", ["plain", "nesterov"])
def test_local_sgd_matches_a_written_out_reference(outer):
    run("local_sgd_matches_reference", args=[outer])


@pytest.mark.timeout(200)
def test_local_sgd_trains_and_checks_its_arguments():
    run("local_sgd_trains")
