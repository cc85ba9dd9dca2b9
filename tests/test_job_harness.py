"""The rank-aware harness of tests/jobs/ (tests/jobs/run.py, multiproc.run_job_function): a job that passes on
every rank returns its output; a failed assertion on one rank fails the test with that rank's number and pytest's
explanation of the assertion, also inside a helper module the job imports."""

import pytest
from multiproc import run_job_function


def test_a_job_that_passes_on_every_rank_returns_its_output():
    out = run_job_function("harness_check:passes", np=2, args=["2"])
    assert out.count("OK harness_check:passes") == 2


def test_a_failed_assertion_names_the_rank_and_explains_the_operands():
    with pytest.raises(AssertionError) as failure:
        run_job_function("harness_check:fails_on_last_rank", np=3)
    message = str(failure.value)
    assert message.startswith("harness_check:fails_on_last_rank: ranks [2] of 3 failed"), message
    assert "--- rank 2 ---" in message and "--- rank 0 ---" not in message, message
    assert "assert 4 == 3" in message, message  # pytest's rewriting: the operand's value, not only its source


def test_assertions_in_an_imported_helper_are_explained_too():
    with pytest.raises(AssertionError) as failure:
        run_job_function("harness_check:fails_in_a_helper", np=2)
    assert "assert 0.5 < 1e-06" in str(failure.value), str(failure.value)


def test_a_script_job_runs_its_top_level_and_explains_its_assertions_too():
    assert run_job_function("harness_script", np=2, args=["5"]).count("OK harness_script") == 2
    with pytest.raises(AssertionError) as failure:
        run_job_function("harness_script", np=2, args=["0"])
    message = str(failure.value)
    assert "ranks [0] of 2 failed" in message and "assert [0, 1] == [0, 0]" in message, message
