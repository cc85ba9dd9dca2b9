"""A small /dev/shm never kills a rank: each rank reserves its shared-memory inbox at init (posix_fallocate),
halves its rings where the configured ones do not fit, and the ranks of a host fall back to TCP together when one
of them has no room at all, with one warning that names /dev/shm, its size, what was needed and the fix.

Each case runs a job in a mount namespace whose /dev/shm is a tmpfs of the given size (root only: CI runs as
root). Cross-memory attach is off, so every byte between the ranks goes through the rings."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from launcher_helpers import hvdlite_run
from multiproc import job_env

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "shm_room_job.py")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a private /dev/shm needs root (unshare -m)")


def run_with_dev_shm(size: str, np: int, extra_env: str = "") -> subprocess.CompletedProcess:
    job = "%s %s -np %d %s %s" % (extra_env, hvdlite_run(), np, sys.executable, JOB)
    script = "mount -t tmpfs -o size=%s tmpfs /dev/shm && HVDLITE_CMA_DISABLE=1 exec %s" % (size, job)
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script], env=job_env(), capture_output=True, text=True, timeout=240
    )


def transports(stdout: str) -> dict:
    return {
        int(rank): (int(shm), int(tcp))
        for rank, shm, tcp in re.findall(r"OK rank=(\d+) shm_peers=(\d+) tcp_peers=(\d+)", stdout)
    }


@pytest.mark.parametrize(
    "size,np", [("2m", 2), ("8m", 2), ("64m", 2), ("2m", 4), ("8m", 4), ("64m", 4), ("2m", 8), ("8m", 8), ("64m", 8)]
)
def test_a_small_dev_shm_slows_the_job_down_but_never_kills_it(size, np):
    result = run_with_dev_shm(size, np)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = transports(result.stdout)
    assert sorted(ranks) == list(range(np)), result.stdout
    warnings = [line for line in result.stderr.splitlines() if "/dev/shm (" in line]
    assert len(warnings) <= 1, "one warning per host, got:\n" + "\n".join(warnings)
    if all(shm == np - 1 for shm, _ in ranks.values()):
        if warnings:  # rings shrank to fit
            assert "smaller shared-memory rings" in warnings[0] and "--shm-size" in warnings[0], warnings[0]
    else:
        assert all(tcp == np - 1 for _, tcp in ranks.values()), ranks  # all or none of the host's ranks
        assert warnings and "shared memory is off" in warnings[0], result.stderr[-3000:]
    if size == "2m":
        assert warnings, "%d ranks cannot have 1 MiB rings in 2 MiB: the shortage must be reported" % np
        assert "/dev/shm (2.0 MiB," in warnings[0] and "HVDLITE_SHM_DISABLE=1" in warnings[0], warnings[0]


def test_no_room_even_for_the_smallest_rings_means_tcp_for_the_whole_host():
    result = run_with_dev_shm("200k", 2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert transports(result.stdout) == {0: (0, 1), 1: (0, 1)}, result.stdout
    warnings = [line for line in result.stderr.splitlines() if "/dev/shm (" in line]
    assert len(warnings) == 1 and "shared memory is off between the 2 ranks on this host" in warnings[0], (
        result.stderr[-3000:]
    )
    assert "--shm-size" in warnings[0] and "HVDLITE_SHM_DISABLE=1" in warnings[0]
