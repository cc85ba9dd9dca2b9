"""The MPI data plane's edges: where MPI cannot be had, asking for it fails on every rank with a message that names
what is missing; ranks that disagree about it are refused at init; --check-build says what is there. The
collectives themselves run on MPI in test_collectives.py, test_errors.py, test_process_sets.py and test_adasum.py.
"""

from __future__ import annotations

import shutil
import sys
import time

import pytest
from launcher_helpers import run_launcher
from multiproc import job_source, run_job


def outcomes(result, tag):
    found = {}
    for line in result.stdout.splitlines():
        if tag + " " in line:
            rank, rest = line.split(tag + " ", 1)[1].split(" ", 1)
            found[int(rank)] = rest
    return found


@pytest.mark.timeout(60)
def test_a_missing_mpi_library_is_named_on_every_rank():
    result = run_job(
        job_source("mpi_backend_init"),
        np=2,
        timeout=40,
        env={
            "HVDLITE_CPU_OPERATIONS": "mpi",
            "RETRY_WITH_BUILTIN": "1",
            "HVDLITE_MPI_PLUGIN": "/nonexistent/_hvdlite_mpi.so",
        },
    )
    refused = outcomes(result, "REFUSED")
    assert sorted(refused) == [0, 1], result.stdout + result.stderr
    for message in refused.values():
        assert "HVDLITE_CPU_OPERATIONS=mpi, but the MPI plugin /nonexistent/_hvdlite_mpi.so does not load" in message
        assert "cannot open shared object file" in message
    assert outcomes(result, "BUILT") == {0: "False", 1: "False"}
    assert outcomes(result, "RETRIED") == {0: "[2.0, 2.0, 2.0]", 1: "[2.0, 2.0, 2.0]"}, result.stdout + result.stderr


def _path_without_mpi(tmp_path, *keep):
    """A PATH that holds only ``keep`` (linked from the real PATH): no MPI compiler wrapper, as on a machine where
    MPI was installed without its development files, or not at all."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in keep:
        (folder / name).symlink_to(shutil.which(name))
    return str(folder)


@pytest.mark.timeout(60)
def test_without_mpi_compiler_wrappers_init_fails_at_once_naming_the_fix(tmp_path):
    """The MPI plugin is compiled on first use with mpicc's flags; without mpicc every rank is refused before it
    contacts a peer, with the command that fixes it, and stays usable."""
    started = time.monotonic()
    result = run_job(
        job_source("mpi_backend_init"),
        np=2,
        timeout=40,
        env={
            "HVDLITE_CPU_OPERATIONS": "mpi",
            "RETRY_WITH_BUILTIN": "1",
            "PATH": _path_without_mpi(tmp_path),
            "HVDLITE_MPI_PLUGIN_CACHE": str(tmp_path / "cache"),
        },
    )
    elapsed = time.monotonic() - started
    refused = outcomes(result, "REFUSED")
    assert sorted(refused) == [0, 1], result.stdout + result.stderr
    for message in refused.values():
        assert message.startswith("HVDLITE_CPU_OPERATIONS=mpi, but hvdlite compiles its MPI plugin on first use"), (
            message
        )
        assert "mpicc" in message and "apt-get install -y openmpi-bin libopenmpi-dev" in message, message
    assert outcomes(result, "BUILT") == {0: "False", 1: "False"}
    assert outcomes(result, "RETRIED") == {0: "[2.0, 2.0, 2.0]", 1: "[2.0, 2.0, 2.0]"}, result.stdout + result.stderr
    assert elapsed < 30, elapsed  # no timeout was waited for
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))


@pytest.mark.timeout(60)
def test_hvdlite_run_mpi_without_mpi_compiler_wrappers_fails_before_starting_ranks(tmp_path):
    marker = tmp_path / "rank-started"
    script = tmp_path / "job.py"
    script.write_text("open(%r, 'w').close()\n" % str(marker))
    result = run_launcher(
        ["--mpi", "-np", "2", sys.executable, str(script)],
        timeout=30,
        env={"PATH": _path_without_mpi(tmp_path, "mpirun"), "HVDLITE_MPI_PLUGIN_CACHE": str(tmp_path / "cache")},
    )
    assert result.returncode != 0
    assert "--mpi moves tensors through MPI, but hvdlite compiles its MPI plugin" in result.stderr, result.stderr
    assert "apt-get install -y openmpi-bin libopenmpi-dev" in result.stderr, result.stderr
    assert "HVDLITE_CPU_OPERATIONS=gloo" in result.stderr
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_mpi_without_an_mpi_launcher_is_a_clear_error():
    """hvdlite-run's own ranks have no MPI runtime to connect them."""
    result = run_job(job_source("mpi_backend_init"), np=2, timeout=40, env={"HVDLITE_CPU_OPERATIONS": "mpi"})
    refused = outcomes(result, "REFUSED")
    assert sorted(refused) == [0, 1], result.stdout + result.stderr
    for message in refused.values():
        assert "not started by an MPI launcher" in message and "hvdlite-run --mpi" in message, message
    assert outcomes(result, "BUILT") == {0: "True", 1: "True"}


@pytest.mark.timeout(60)
def test_ranks_that_disagree_about_the_backend_are_refused():
    result = run_job(job_source("mpi_backend_init"), np=3, timeout=40, env={"RANK1_CPU_OPERATIONS": "mpi"})
    refused = outcomes(result, "REFUSED")
    assert sorted(refused) == [0, 1, 2], result.stdout + result.stderr
    assert len(set(refused.values())) == 1, refused
    assert "HVDLITE_CPU_OPERATIONS differs between ranks: builtin on ranks 0, 2, mpi on rank 1" in refused[0]


@pytest.mark.timeout(60)
def test_unknown_backend_names_the_choices():
    result = run_job(job_source("mpi_backend_init"), np=1, timeout=40, env={"HOROVOD_CPU_OPERATIONS": "ccl"})
    message = outcomes(result, "REFUSED")[0]
    assert "HVDLITE_CPU_OPERATIONS (or HOROVOD_CPU_OPERATIONS) is 'ccl'" in message
    assert "builtin (alias gloo) and mpi" in message
    # Horovod's name for the built-in kind of backend is accepted
    gloo = run_job(job_source("mpi_backend_init"), np=2, timeout=40, env={"HOROVOD_CPU_OPERATIONS": "gloo"})
    assert outcomes(gloo, "INITIALIZED") == {0: "enabled=False", 1: "enabled=False"}, gloo.stdout + gloo.stderr


@pytest.mark.timeout(60)
def test_check_build_names_the_mpi_library_or_why_not():
    present = run_launcher(["--check-build"], timeout=30)
    assert "    [X] MPI (Open MPI v4" in present.stdout, present.stdout
    absent = run_launcher(["--check-build"], timeout=30, env={"HVDLITE_MPI_PLUGIN": "/nonexistent/plugin.so"})
    assert "    [ ] MPI: the MPI plugin /nonexistent/plugin.so does not load" in absent.stdout, absent.stdout


DIES = """
import os, sys, time
import torch
import hvdlite.torch as hvd
hvd.init()
assert hvd.mpi_enabled()
hvd.allreduce(torch.ones(4), name="warmup")
sys.stdout.write("PID %d %d\\n" % (hvd.rank(), os.getpid()))
sys.stdout.flush()
if hvd.rank() == 1:
    time.sleep(1.0)  # the others are inside MPI_Allreduce by now
    os._exit(7)
hvd.allreduce(torch.ones(1 << 20), name="never")
sys.stdout.write("SURVIVED %d\\n" % hvd.rank())
"""


@pytest.mark.timeout(90)
def test_a_dead_rank_ends_an_mpi_job_within_seconds():
    """Ranks blocked inside MPI cannot be woken with an error: Open MPI's mpirun ends the whole job when a rank
    dies, with that rank's exit code, and nothing is left running."""
    import time

    start = time.monotonic()
    result = run_job(DIES, np=3, timeout=60, launcher="mpi")
    elapsed = time.monotonic() - start
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "SURVIVED" not in out, out
    assert elapsed < 20, (elapsed, out)
    pids = [int(line.split()[-1]) for line in result.stdout.splitlines() if "PID " in line]
    assert len(pids) == 3, out

    def running(pid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                return f.read().split()[2] != "Z"
        except OSError:
            return False

    # mpirun may return while a killed rank is still being torn down by the kernel
    deadline = time.monotonic() + 5
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if running(pid)], out


SUBSET = """
import sys
import torch
from mpi4py import MPI
import hvdlite.torch as hvd

world = MPI.COMM_WORLD.Get_rank()
if world in (0, 2):
    hvd.init(comm=[0, 2])             # Horovod's list form: only these COMM_WORLD ranks take part
    assert hvd.mpi_enabled() and (hvd.rank(), hvd.size()) == (world // 2, 2)
    total = hvd.allreduce(torch.tensor([float(world)]), op=hvd.Sum, name="t")
    rows = hvd.allgather(torch.tensor([[world]]), name="g")
    sys.stdout.write("SUBSET world=%d rank=%d total=%s rows=%s\\n" % (world, hvd.rank(), total.tolist(),
                                                                    rows.flatten().tolist()))
    hvd.shutdown()
# The application's own MPI traffic goes on beside hvdlite's (MPI_THREAD_MULTIPLE, its own communicator).
values = MPI.COMM_WORLD.allgather(world)
sys.stdout.write("APP world=%d %s\\n" % (world, values))
"""


@pytest.mark.timeout(90)
def test_a_subset_of_comm_world_moves_its_tensors_through_mpi(tmp_path):
    """init(comm=[0, 2]) under mpirun -np 3 with the MPI backend: the data plane uses that group's communicator,
    and the application's own MPI calls afterwards still work on every rank."""
    import subprocess
    import sys

    from launcher_helpers import write_script
    from multiproc import REPO_ROOT, job_env

    script = write_script(tmp_path, SUBSET)
    env = job_env(
        {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "HVDLITE_CPU_OPERATIONS": "mpi"}
    )
    env.pop("PYTHONUNBUFFERED", None)
    result = subprocess.run(
        ["mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", sys.executable, script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=80,
        stdin=subprocess.DEVNULL,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith(("SUBSET", "APP")))
    assert lines == [
        "APP world=0 [0, 1, 2]",
        "APP world=1 [0, 1, 2]",
        "APP world=2 [0, 1, 2]",
        "SUBSET world=0 rank=0 total=[2.0] rows=[0, 2]",
        "SUBSET world=2 rank=1 total=[2.0] rows=[0, 2]",
    ], out
