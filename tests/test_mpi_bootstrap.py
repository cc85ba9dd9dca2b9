"""hvd.init() under Open MPI's mpirun (bootstrap through mpi4py), init(comm=...), and hvdlite-run --mpi.

These tests fail, not skip, without mpirun or mpi4py (.ci/run installs Open MPI, the dev extra mpi4py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from launcher_helpers import run_launcher
from multiproc import REPO_ROOT, job_env

PY = sys.executable
# Run by mpirun and hvdlite-run --mpi directly: rank 0 of mpirun is not a job the harness starts.
MPI_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "mpi_bootstrap_check.py")


def _require_mpi():
    missing = [
        what
        for what, ok in (
            ("mpirun (apt-get install openmpi-bin)", shutil.which("mpirun")),
            ("mpi4py (pip install -e .[mpi])", _has_mpi4py()),
        )
        if not ok
    ]
    if missing:
        pytest.fail("the MPI bootstrap tests need %s" % " and ".join(missing), pytrace=False)


def _has_mpi4py() -> bool:
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def _check_output(stdout: str, prefixed: bool):
    prefix = r"\[(\d)\]<stdout>: " if prefixed else r"()"
    lines = {}
    for line in stdout.splitlines():
        match = re.fullmatch(prefix + r"(ENV|COMM) world=(\d) rank=(\d) gathered=(\[.*\]) cycle=(\S+)", line)
        if match:
            lines[match.group(2), int(match.group(3))] = (int(match.group(4)), match.group(5), match.group(6))
    # init() numbers ranks as COMM_WORLD does; init(comm=reversed) as the reversed communicator does.
    assert {key: value[:2] for key, value in lines.items()} == {
        ("ENV", 0): (0, "[0, 1]"),
        ("ENV", 1): (1, "[0, 1]"),
        ("COMM", 0): (1, "[1, 0]"),
        ("COMM", 1): (0, "[1, 0]"),
    }, stdout
    return {value[2] for value in lines.values()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["builtin", "mpi"])
def test_init_under_mpirun_and_with_a_communicator(tmp_path, backend):
    """Plain mpirun: the placement comes from MPI; the tensors move through the built-in backend unless
    HVDLITE_CPU_OPERATIONS=mpi, which then uses the communicator init() was given (rank order included)."""
    _require_mpi()
    script = MPI_JOB
    env = job_env(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "EXPECT_BACKEND": backend,
            "HVDLITE_CPU_OPERATIONS": backend,
        }
    )
    result = subprocess.run(
        ["mpirun", "-np", "2", "--oversubscribe", PY, script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    _check_output(result.stdout, prefixed=False)


@pytest.mark.timeout(180)
def test_the_mpi_plugin_is_compiled_once_on_first_use(tmp_path):
    """Ranks that start together against an empty plugin cache: one compiles the plugin for this machine's MPI,
    the other waits for it, and a later job loads it without compiling."""
    _require_mpi()
    script = MPI_JOB
    cache = tmp_path / "cache"
    env = job_env(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "EXPECT_BACKEND": "mpi",
            "HVDLITE_CPU_OPERATIONS": "mpi",
            "HVDLITE_MPI_PLUGIN_CACHE": str(cache),
        }
    )
    env.pop("HVDLITE_MPI_PLUGIN", None)
    built = []
    for _ in range(2):
        result = subprocess.run(
            ["mpirun", "-np", "2", "--oversubscribe", PY, script],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        _check_output(result.stdout, prefixed=False)
        plugins = sorted(cache.glob("*/_hvdlite_mpi.so"))
        assert len(plugins) == 1, plugins
        built.append((plugins[0], plugins[0].stat().st_mtime_ns))
        assert not list(cache.glob("*/.build-*")), list(cache.iterdir())  # no half-built leftovers
    assert built[0] == built[1], built  # the second job compiled nothing


@pytest.mark.timeout(120)
def test_hvdlite_run_mpi_hands_the_job_to_mpirun(tmp_path):
    _require_mpi()
    script = MPI_JOB
    # Launcher variables in hvdlite-run's own environment must not reach the MPI ranks.
    # --mpi also moves the tensors through MPI.
    # PYTHONUNBUFFERED=1 (common in containers) has print() write its pieces separately: lines stay whole.
    result = run_launcher(
        ["--mpi", "-np", "2", "--cycle-time-ms", "3", "--verbose", PY, script],
        timeout=100,
        env={"HVDLITE_RANK": "5", "EXPECT_BACKEND": "mpi", "PYTHONUNBUFFERED": "1", "PRINT_PIECES": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hvdlite: running " in result.stderr and " hvdlite.runner.rank_lines -- " in result.stderr
    assert _check_output(result.stdout, prefixed=True) == {"3"}  # --cycle-time-ms reached every rank's core
    pieces = [line for line in result.stdout.splitlines() if "PIECES" in line]
    assert sorted(pieces) == sorted(f"[{r}]<stdout>: PIECES {r} {i}" for r in range(2) for i in range(20)), (
        result.stdout
    )
