"""Local ranks die with their launcher: ``kill -9`` of the process that started them (``hvdlite-run``,
``python -m hvdlite.runner.local``, the elastic driver, a script calling ``hvdlite.run``) leaves no rank alive
3 s later and no shared-memory segment behind, five times for each. The mechanism is launcher/lifeline.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from launcher_helpers import hvdlite_run
from multiproc import job_env

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(TESTS_DIR, "jobs", "lifeline_job.py")
TRIALS = 5
NP = 2


def launcher_command(entry: str, out_dir: str) -> list:
    job = [sys.executable, JOB, out_dir]
    if entry == "hvdlite-run":
        return [hvdlite_run(), "-np", str(NP), *job]
    if entry == "runner.local":
        return [sys.executable, "-m", "hvdlite.runner.local", "-np", str(NP), "--", *job]
    if entry == "elastic":
        discover = os.path.join(out_dir, "discover.sh")
        with open(discover, "w") as f:
            f.write("#!/bin/sh\necho localhost:%d\n" % NP)
        os.chmod(discover, 0o755)
        return [
            hvdlite_run(),
            "-np",
            str(NP),
            "--min-np",
            str(NP),
            "--max-np",
            str(NP),
            "--host-discovery-script",
            discover,
            *job,
        ]
    assert entry == "hvdlite.run"
    # The ranks unpickle the function by reference: its folder is on their path through PYTHONPATH.
    program = (
        "import os, sys; sys.path.insert(0, %r); os.environ['PYTHONPATH'] += os.pathsep + sys.path[0]\n"
        "import hvdlite, lifeline_job\n"
        "hvdlite.run(lifeline_job.run_forever, args=(%r,), np=%d)\n" % (os.path.dirname(JOB), out_dir, NP)
    )
    return [sys.executable, "-c", program]


def is_running(pid: int) -> bool:
    """Alive and not a zombie waiting for whoever inherited it."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def wait_for_ranks(out_dir: str, launcher: subprocess.Popen, timeout: float = 60.0) -> list:
    """[(pid, job id)] of the ranks, once every rank has done its first allreduce."""
    deadline = time.monotonic() + timeout
    paths = [os.path.join(out_dir, "rank%d" % r) for r in range(NP)]
    while not all(os.path.exists(p) for p in paths):
        assert launcher.poll() is None, "the launcher exited with %s before the ranks were up" % launcher.returncode
        assert time.monotonic() < deadline, "the ranks did not start within %g s" % timeout
        time.sleep(0.05)
    ranks = []
    for path in paths:
        with open(path) as f:
            pid, job_id = (f.read().split() + [""])[:2]
        ranks.append((int(pid), job_id))
    return ranks


@pytest.mark.parametrize("entry", ["hvdlite-run", "runner.local", "elastic", "hvdlite.run"])
def test_ranks_die_with_a_killed_launcher(entry, tmp_path):
    for trial in range(TRIALS):
        out_dir = tmp_path / ("trial%d" % trial)
        out_dir.mkdir()
        launcher = subprocess.Popen(
            launcher_command(entry, str(out_dir)),
            env=job_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        ranks = []
        try:
            ranks = wait_for_ranks(str(out_dir), launcher)
            os.kill(launcher.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            launcher.wait()
            while any(is_running(pid) for pid, _ in ranks) and time.monotonic() - killed_at < 3.0:
                time.sleep(0.02)
            alive = [pid for pid, _ in ranks if is_running(pid)]
            stderr = launcher.stderr.read().decode(errors="replace")
            assert not alive, "trial %d: ranks %s still run 3 s after the launcher was killed; its stderr:\n%s" % (
                trial,
                alive,
                stderr[-2000:],
            )
            assert "the launcher (pid %d) is gone" % launcher.pid in stderr, stderr[-2000:]
            job_ids = {job_id for _, job_id in ranks if job_id}
            left = [
                name
                for name in os.listdir("/dev/shm")
                if any(name.startswith("hvdlite-%s-" % job_id) for job_id in job_ids)
            ]
            assert not left, "trial %d: shared memory left behind: %s" % (trial, left)
        finally:
            for pid, _ in ranks:
                if is_running(pid):
                    os.killpg(pid, signal.SIGKILL)
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
            launcher.stderr.close()


def test_a_launcher_that_exits_normally_leaves_the_watcher_nothing_to_stop(tmp_path):
    """The watcher only acts on ranks the launcher has not reaped: a finished job prints no lifeline line."""
    result = subprocess.run(
        [hvdlite_run(), "-np", "2", sys.executable, "-c", "print('done')"],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    time.sleep(0.3)  # the watcher reads the end of the pipe once the launcher has gone
    assert "is gone" not in result.stderr
