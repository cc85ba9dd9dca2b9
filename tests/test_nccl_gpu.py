"""CUDA tensors on a real GPU and the real NCCL, one GPU per rank; skipped where torch sees no CUDA device (CI has
none: test_nccl_data_plane.py covers the same path there with a fake CUDA runtime and NCCL)."""

from __future__ import annotations

import os

import pytest
import torch
from hvdjob import assert_job_ok, prelude
from multiproc import run_job

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "nccl_gpu.py")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS == 0, reason="no CUDA device visible to torch")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("np", [1, 2])
def test_cuda_tensors_on_nccl(np):
    if np > GPUS:
        pytest.skip(f"{np} ranks need {np} GPUs (NCCL takes one device per rank); {GPUS} visible")
    with open(JOB, encoding="utf-8") as f:
        script = prelude() + f.read()
    result = run_job(script, np=np, timeout=240)
    assert_job_ok(result, np, min_count=30)
