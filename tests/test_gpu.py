"""CUDA tensors on a real GPU with the real CUDA runtime and NCCL; skipped where torch sees no CUDA device (CI has
none: test_nccl_data_plane.py covers the same code on a fake CUDA runtime and NCCL). tools/gpu_check.sh runs this
module on a GPU machine. One GPU is enough: one rank runs on NCCL, and two ranks sharing the GPU run staged through
host memory (NCCL refuses them), or fail on every rank where NCCL was forced."""

from __future__ import annotations

import pytest
import torch
from hvdjob import assert_job_ok, prelude
from launcher_helpers import run_launcher
from multiproc import job_source, run_job

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no CUDA device visible to torch")
ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}  # every rank sees the same one


def run_gpu_job(np, plane, env):
    script = job_source("gpu_collectives")
    result = run_job(script, np=np, env={**env, "EXPECT_PLANE": plane}, timeout=400)
    print(result.stdout[-3000:])  # the figures, for tools/gpu_check.sh's log
    assert_job_ok(result, np, min_count=140)
    assert_job_ok(result, np, tag="TRAINED")
    return result


@pytest.mark.timeout(500)
def test_one_rank_runs_every_collective_on_nccl():
    run_gpu_job(1, "NCCL", ONE_GPU)


@pytest.mark.timeout(500)
def test_two_ranks_on_one_gpu_are_staged_through_host_memory_with_one_warning():
    result = run_gpu_job(2, "STAGED", ONE_GPU)
    warnings = [line for line in result.stderr.splitlines() if "NCCL takes one GPU per rank" in line]
    assert len(warnings) == 1 and "ranks 0 and 1 share GPU " in warnings[0], result.stderr[-3000:]


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
@pytest.mark.timeout(500)
def test_two_ranks_with_a_gpu_each_run_on_nccl():
    run_gpu_job(2, "NCCL", {})


@pytest.mark.timeout(120)
def test_forced_nccl_on_a_shared_gpu_fails_on_every_rank_and_the_job_goes_on():
    script = (
        prelude()
        + """
import torch
import hvdlite.torch as hvd
from hvdjob import expect_raises
hvd.init()
torch.cuda.set_device(0)
x = torch.ones(4, device="cuda")
for name in ("first", "second"):
    expect_raises("CUDA allreduce on a shared GPU", hvd.InvalidArgumentError, hvd.allreduce, x, name=name,
                  match=[f"allreduce of tensor '{name}': HVDLITE_GPU_OPERATIONS=nccl, but ranks 0 and 1 share GPU ",
                         "NCCL takes one GPU per rank"])
assert hvd.allreduce(torch.ones(2), name="host", op=hvd.Sum).tolist() == [2.0, 2.0]
print("OK 1 on rank", hvd.rank(), flush=True)
"""
    )
    result = run_job(script, np=2, env={**ONE_GPU, "HVDLITE_GPU_OPERATIONS": "nccl"}, timeout=100)
    assert_job_ok(result, 2)


@pytest.mark.timeout(60)
def test_check_build_reports_nccl_and_its_version():
    result = run_launcher(["--check-build"], timeout=50, env={})
    print(result.stdout)
    line = next((s for s in result.stdout.splitlines() if "NCCL" in s), "")
    assert line.startswith("    [X] NCCL 2.") and "for CUDA tensors" in line, result.stdout
