"""hvdlite.ray.RayExecutor on a real local Ray cluster: a head and a worker node, started as separate processes
with different addresses (127.0.0.3 and 127.0.0.2), so the executor sees two hosts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
HEAD, NODE = "127.0.0.3", "127.0.0.2"
ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
JOBS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")


def _free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    port = _free_port(HEAD)
    temp_dir = tempfile.mkdtemp(prefix="hvdlite-ray-")
    common = ["--num-cpus=2", "--object-store-memory=100000000", "--disable-usage-stats"]
    try:
        subprocess.run(
            [
                RAY,
                "start",
                "--head",
                f"--node-ip-address={HEAD}",
                f"--port={port}",
                "--include-dashboard=false",
                f"--temp-dir={temp_dir}",
            ]
            + common,
            env=ENV,
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [RAY, "start", f"--address={HEAD}:{port}", f"--node-ip-address={NODE}"] + common,
            env=ENV,
            check=True,
            capture_output=True,
            timeout=120,
        )
        yield f"{HEAD}:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], env=ENV, capture_output=True, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)  # the cluster's logs and sockets, about 1 MB a run


def _run_driver(address, job, timeout=240):
    """Runs tests/jobs/<job>.py as a Ray driver of the test's cluster, through the job harness (tests/jobs/run.py),
    which explains a failed assertion as pytest does."""
    env = dict(ENV, HVDLITE_TEST_JOBS_DIR=JOBS_DIR)
    result = subprocess.run(
        [sys.executable, os.path.join(JOBS_DIR, "run.py"), job, address, HEAD],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0 and "OK " + job in result.stdout, result.stdout + result.stderr
    return result.stdout


def test_executor_runs_one_job_across_two_ray_nodes(ray_cluster):
    _run_driver(ray_cluster, "ray_one_job_across_nodes")


def test_worker_failure_stops_the_job_and_names_the_rank(ray_cluster):
    _run_driver(ray_cluster, "ray_worker_failure")


def test_argument_errors_need_no_cluster():
    from hvdlite.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=10)
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(settings, num_workers=2, gpus_per_worker=1)
    with pytest.raises(ValueError, match="either num_workers"):
        RayExecutor(settings, num_workers=2, num_hosts=2)
    with pytest.raises(RuntimeError, match="not started"):
        RayExecutor(settings, num_workers=2).run(print)


def test_ray_example_trains():
    """examples/ray_train.py as a user runs it: it starts its own local Ray, trains, prints the weights."""
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "ray_train.py")
    result = subprocess.run(
        [sys.executable, example, "--epochs", "3"], env=ENV, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    final_loss = float(result.stdout.split("epoch 2: loss ")[1].split()[0])
    assert final_loss < 0.01, result.stdout
    learned = [float(w) for w in result.stdout.split("learned weights ")[1].split("|")[0].split()]
    assert max(abs(a - b) for a, b in zip(learned, [2.0, -3.0, 0.5, 1.0])) < 0.05, result.stdout


def test_a_killed_driver_takes_its_workers_with_it(ray_cluster, tmp_path):
    """kill -9 of the driver process: Ray ends the job's actors, so no rank is left allreducing on its own."""
    import signal
    import time

    driver = subprocess.Popen(
        [sys.executable, os.path.join(JOBS_DIR, "ray_lifeline_driver.py"), ray_cluster, HEAD, str(tmp_path)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    paths = [os.path.join(tmp_path, f"rank{r}") for r in range(2)]
    deadline = time.monotonic() + 120
    while not all(os.path.exists(p) for p in paths):
        assert driver.poll() is None, driver.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)
    pids = [int(open(p).read().split()[0]) for p in paths]
    driver.kill()
    killed_at = time.monotonic()
    driver.wait()

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(") ", 1)[1][:1] != "Z"
        except OSError:
            return False

    while any(running(pid) for pid in pids) and time.monotonic() - killed_at < 10:
        time.sleep(0.05)
    gone_after = time.monotonic() - killed_at
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
    assert not any(running(pid) for pid in pids) and gone_after < 3.0, (
        f"the Ray workers were still running {gone_after:.1f} s after their driver was killed"
    )
