"""hvd.init() without hvdlite-run: under torchrun (the real one, torch.distributed.run) and inside a Slurm
step (srun is not installed here: the ranks get the variables srun sets). Rank 0 hosts the rendezvous."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from launcher_helpers import write_script
from multiproc import REPO_ROOT, job_env

PY = sys.executable

SCRIPT = """
import os, sys
import torch
import hvdlite.torch as hvd
from hvdlite.common import bootstrap

method = bootstrap.detect_method(os.environ)
assert method == sys.argv[1], method
hvd.init()
r, n = hvd.rank(), hvd.size()
total = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum)
gathered = hvd.allgather(torch.tensor([r * 10]))
assert total.item() == n * (n + 1) / 2 and gathered.tolist() == [10 * k for k in range(n)], (total, gathered)
sys.stdout.write("OK %s rank=%d size=%d local=%d/%d cross=%d/%d\\n" % (
    method, r, n, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()))
"""


def free_port_pair() -> int:
    """A port p with p and p + 1 both free right now (torchrun takes p, hvdlite's rendezvous p + 1)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free pair of ports")


def ok_lines(stdout: str):
    return sorted(line for line in stdout.splitlines() if line.startswith("OK "))


@pytest.mark.timeout(120)
def test_torchrun(tmp_path):
    script = write_script(tmp_path, SCRIPT)
    port = free_port_pair()
    env = job_env()
    env.pop("HVDLITE_SECRET", None)
    cmd = [
        PY,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        script,
        "torchrun",
    ]
    result = subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert ok_lines(result.stdout) == [
        "OK torchrun rank=0 size=2 local=0/2 cross=0/1",
        "OK torchrun rank=1 size=2 local=1/2 cross=0/1",
    ], result.stdout
    # Without HVDLITE_SECRET, rank 0 says that the job is not authenticated.
    assert "HVDLITE_SECRET is not set" in result.stderr


@pytest.mark.timeout(120)
def test_slurm_step(tmp_path):
    script = write_script(tmp_path, SCRIPT)
    port = free_port_pair()
    secret = os.urandom(32).hex()  # the same on every rank, as a batch script would export it
    procs = []
    for rank in range(2):
        env = job_env(
            {
                "SLURM_JOB_ID": str(os.getpid()),
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank),
                "SLURM_NODEID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_NTASKS": "2",
                "SLURM_STEP_NUM_NODES": "1",
                "SLURM_STEP_NODELIST": "localhost",
                "SLURMD_NODENAME": "localhost",
                "HVDLITE_RENDEZVOUS_PORT": str(port),
                "HVDLITE_SECRET": secret,
            }
        )
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        procs.append(
            subprocess.Popen(
                [PY, script, "slurm"],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=90))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stdout = "".join(out for out, _ in outputs)
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert ok_lines(stdout) == [
        "OK slurm rank=0 size=2 local=0/2 cross=0/1",
        "OK slurm rank=1 size=2 local=1/2 cross=0/1",
    ], outputs
    assert "HVDLITE_SECRET is not set" not in "".join(err for _, err in outputs)
