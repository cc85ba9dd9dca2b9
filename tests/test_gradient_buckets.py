"""DistributedOptimizer's gradient buckets (hvdlite/torch/gradient_buckets.py) across real processes: every kind of
gradient they meet ends as a one-process reference on the global batch would have it (tests/jobs/gradient_buckets.py),
reducing during backward and all at once in step()."""

import os

import pytest
from multiproc import run_job_function, run_job_module


@pytest.mark.timeout(200)
@pytest.mark.parametrize("during_backward", ["1", "0"], ids=["during-backward", "in-step"])
@pytest.mark.parametrize("np", [2, 3])
def test_buckets_match_one_process_on_every_kind_of_gradient(np, during_backward):
    run_job_module("gradient_buckets.py", np=np, args=[during_backward], timeout=150)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("during_backward", ["1", "0"], ids=["during-backward", "in-step"])
def test_buckets_match_one_process_with_the_optimizer_all_in_python(during_backward):
    # The core bound through cffi's ABI mode (the manylinux wheel's), which leaves hvdlite._fast_calls unused: the
    # hook and the buckets' reads are the Python ones alone.
    core = os.path.join(os.path.dirname(os.path.dirname(__file__)), "hvdlite", "_hvdlite_core.so")
    run_job_function(
        "gradient_buckets", np=2, args=[during_backward], timeout=150, env={"HVDLITE_CORE_LIBRARY": core}
    )


@pytest.mark.timeout(200)
def test_buckets_taking_every_parameter_at_once_match_one_process():
    run_job_module("gradient_buckets.py", np=2, args=["0", "dense"], timeout=150)


@pytest.mark.timeout(150)
def test_models_that_differ_only_in_a_bucketed_layout_fail_naming_the_parameter():
    run_job_function("bucket_layouts", np=2, timeout=120)
