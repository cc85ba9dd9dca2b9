"""Mixed precision with torch.amp.GradScaler and DistributedOptimizer across real processes (tests/jobs/
mixed_precision.py): the plain pattern, with clipping, and Horovod's, under bf16 and fp16 autocast, match one
process on the global batch, and an overflow on one rank makes every rank skip that step."""

import pytest
from multiproc import run_job_module


@pytest.mark.timeout(200)
@pytest.mark.parametrize("during_backward", ["1", "0"], ids=["during-backward", "in-step"])
@pytest.mark.parametrize("np", [2, 3])
def test_grad_scaler_matches_one_process_and_all_ranks_skip_an_overflow(np, during_backward):
    run_job_module("mixed_precision.py", np=np, args=[during_backward], timeout=150)
