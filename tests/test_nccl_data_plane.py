"""The NCCL data plane for CUDA tensors, across real processes.

Without a GPU (CI), tests/fake_cuda provides a CUDA runtime and an NCCL over host memory, built here with the C++
compiler; the job (tests/jobs/nccl_fake.py) runs every collective through hvdlite.torch with CPU tensors placed
"on the device", checks the results and the errors, and that each collective waited on its caller's stream.
With a real GPU, test_gpu.py runs CUDA tensors on the real libraries (tools/gpu_check.sh)."""

from __future__ import annotations

import os
import subprocess

import pytest
from hvdjob import assert_job_ok, prelude
from launcher_helpers import run_launcher
from multiproc import job_source, run_job

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake_cuda")
    libraries = {}
    for name in ("cudart", "nccl"):
        target = str(out / f"libfake_{name}.so")
        subprocess.run(
            [
                "c++",
                "-std=c++17",
                "-O1",
                "-shared",
                "-fPIC",
                "-o",
                target,
                os.path.join(HERE, "fake_cuda", f"fake_{name}.cc"),
            ],
            check=True,
        )
        libraries[name] = target
    return {
        "HVDLITE_CUDART_LIBRARY": libraries["cudart"],
        "HVDLITE_NCCL_LIBRARY": libraries["nccl"],
        "FAKE_CUDA_DEVICES": "2",
        "FAKE_NCCL_TIMEOUT": "60",
    }


# (id, np, host_ids, extra env, the data plane expected, the warning expected on rank 0): events that complete only
# after a few queries exercise the completion queue. With FAKE_CUDA_SHARED_GPU every process on a host sees the same
# GPU, so ranks on one (emulated) host share one and their collectives are staged through host memory.
SHARED_WARNING = "and NCCL takes one GPU per rank: the job's CUDA collectives are staged through host memory"
CASES = [
    ("np2", 2, None, {}, "NCCL", None),
    ("np3-2hosts-slow-events", 3, [0, 1, 0], {"FAKE_CUDA_EVENT_POLLS": "3"}, "NCCL", None),
    (
        "np3-2hosts-shared-gpu",
        3,
        [0, 1, 0],
        {"FAKE_CUDA_SHARED_GPU": "1", "FAKE_CUDA_EVENT_POLLS": "2"},
        "STAGED",
        "ranks 0 and 2 share GPU 0000:01:00.0, " + SHARED_WARNING,
    ),
    ("np2-host-forced", 2, None, {"HVDLITE_GPU_OPERATIONS": "host"}, "STAGED", None),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_nccl_data_plane_on_fake_cuda(fake_cuda, case):
    _, np, host_ids, env, plane, warning = case
    script = job_source("nccl_fake")
    env = {**fake_cuda, **env, "EXPECT_PLANE": plane}
    result = run_job(script, np=np, host_ids=host_ids, env=env, timeout=200)
    assert_job_ok(result, np, min_count=400)
    assert_job_ok(result, np, tag="RELEASED")
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("hvdfake_nccl")]
    assert not leftovers, f"fake NCCL files left in /dev/shm: {leftovers[:5]}"
    # One warning per process set whose members share a GPU, from its first member only; none otherwise.
    warnings = [line for line in result.stderr.splitlines() if "NCCL takes one GPU per rank" in line]
    if warning is None:
        assert not warnings, warnings
    else:
        assert len(warnings) == 2, result.stderr[-4000:]  # the job's, then process set [0, 2]'s
        assert warnings[0].startswith("[") and " W hvdlite rank 0] " in warnings[0], warnings
        assert warnings[0].endswith(
            warning + ", at host speed. Give each rank its own GPU for NCCL, or set "
            "HVDLITE_GPU_OPERATIONS=host to stage without this warning"
        ), warnings
        assert "process set 1's CUDA collectives are staged" in warnings[1], warnings


def test_forced_nccl_on_a_shared_gpu_fails_on_every_rank(fake_cuda):
    """HVDLITE_GPU_OPERATIONS=nccl where ranks share a GPU: every rank's CUDA collective fails naming the ranks and
    the GPU, again on the next one, and host collectives go on working."""
    script = (
        prelude()
        + """
import torch
import hvdlite.torch as hvd
from hvdlite.torch import core_ops
from hvdjob import expect_raises
hvd.init()
core_ops.cpu_placement = (0, 0)
for name in ("first", "second"):
    expect_raises("CUDA allreduce on a shared GPU", hvd.InvalidArgumentError, hvd.allreduce, torch.ones(2),
                  name=name,
                  match=[f"allreduce of tensor '{name}': HVDLITE_GPU_OPERATIONS=nccl, but ranks 0 and 1 share GPU "
                         "0000:01:00.0, and NCCL takes one GPU per rank", "torch.cuda.set_device(hvd.local_rank())",
                         "unset HVDLITE_GPU_OPERATIONS to stage the job's CUDA collectives through host memory"])
core_ops.cpu_placement = (-1, 0)
assert hvd.allreduce(torch.ones(2), name="host", op=hvd.Sum).tolist() == [2.0, 2.0]
print("OK 1 on rank", hvd.rank(), flush=True)
"""
    )
    env = {**fake_cuda, "FAKE_CUDA_SHARED_GPU": "1", "HVDLITE_GPU_OPERATIONS": "nccl"}
    result = run_job(script, np=2, env=env, timeout=60)
    assert_job_ok(result, 2)


def test_cuda_tensor_without_nccl_is_a_clear_error(fake_cuda):
    """Where no NCCL loads, a CUDA tensor fails at enqueue naming what is missing; host tensors keep working."""
    script = (
        prelude()
        + """
import torch
import hvdlite.torch as hvd
from hvdlite.torch import core_ops
from hvdjob import expect_raises
hvd.init()
assert not hvd.nccl_built() and not hvd.gpu_available("torch")
core_ops.cpu_placement = (0, 0)
expect_raises("CUDA tensor without NCCL", hvd.InvalidArgumentError, hvd.allreduce, torch.ones(2), name="x",
              match=["tensor 'x' is in CUDA memory", "no NCCL library could be loaded", "HVDLITE_NCCL_LIBRARY"])
core_ops.cpu_placement = (-1, 0)
assert hvd.allreduce(torch.ones(2), name="y", op=hvd.Sum).tolist() == [2.0, 2.0]
print("OK 1 on rank", hvd.rank(), flush=True)
"""
    )
    env = {
        "HVDLITE_CUDART_LIBRARY": fake_cuda["HVDLITE_CUDART_LIBRARY"],
        "HVDLITE_NCCL_LIBRARY": "/nonexistent/libnccl.so.2",
    }
    result = run_job(script, np=2, env=env, timeout=60)
    assert_job_ok(result, 2)


@pytest.mark.timeout(60)
def test_check_build_names_nccl_or_why_not(fake_cuda):
    present = run_launcher(["--check-build"], timeout=30, env=fake_cuda)
    assert (
        f"    [X] NCCL 2.18.5 for CUDA tensors ({fake_cuda['HVDLITE_NCCL_LIBRARY']}, 2 device(s))" in present.stdout
    ), present.stdout
    absent = run_launcher(
        ["--check-build"], timeout=30, env={**fake_cuda, "HVDLITE_NCCL_LIBRARY": "/nonexistent/x.so"}
    )
    assert "    [ ] NCCL: no NCCL library could be loaded (/nonexistent/x.so: " in absent.stdout, absent.stdout
    no_device = run_launcher(["--check-build"], timeout=30, env={**fake_cuda, "FAKE_CUDA_DEVICES": "0"})
    assert "    [ ] NCCL: the CUDA runtime sees no device" in no_device.stdout, no_device.stdout


@pytest.mark.timeout(60)
def test_libraries_from_pip_wheels_are_found(fake_cuda, tmp_path):
    """The nvidia-nccl-cu12 / nvidia-cuda-runtime-cu12 wheels put their libraries in site-packages/nvidia/*/lib,
    off the library path: hvdlite finds them on sys.path (here: the fakes laid out the same way)."""
    import shutil

    for variable, parts in (
        ("HVDLITE_NCCL_LIBRARY", ("nccl", "lib", "libnccl.so.2")),
        ("HVDLITE_CUDART_LIBRARY", ("cuda_runtime", "lib", "libcudart.so.12")),
    ):
        target = tmp_path.joinpath("nvidia", *parts)
        target.parent.mkdir(parents=True)
        shutil.copy(fake_cuda[variable], target)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "FAKE_CUDA_DEVICES": "1"}
    result = run_launcher(["--check-build"], timeout=30, env=env)
    wheel_nccl = tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    assert f"    [X] NCCL 2.18.5 for CUDA tensors ({wheel_nccl}, 1 device(s))" in result.stdout, result.stdout
