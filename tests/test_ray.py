"""hvdlite.ray.RayExecutor on a real local Ray cluster: a head and a worker node, started as separate processes
with different addresses (127.0.0.3 and 127.0.0.2), so the executor sees two hosts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import pytest

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
HEAD, NODE = "127.0.0.3", "127.0.0.2"
ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")


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


def _run_driver(address, body, timeout=240):
    script = f"""
import os, time
import ray
ray.init(address={address!r}, _node_ip_address={HEAD!r}, log_to_driver=False)
from hvdlite.ray import RayExecutor, WorkerError
SETTINGS = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=20)
{body}
print("DONE")
"""
    result = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0 and "DONE" in result.stdout, result.stdout + result.stderr
    return result.stdout


def test_executor_runs_one_job_across_two_ray_nodes(ray_cluster):
    _run_driver(
        ray_cluster,
        """
def train(scale):
    import torch
    import hvdlite.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.full((3,), float(hvd.rank() + 1)) * scale, op=hvd.Sum, name="total")
    gathered = hvd.allgather(torch.tensor([[hvd.rank()]]), name="ranks")
    return dict(rank=hvd.rank(), size=hvd.size(), local=(hvd.local_rank(), hvd.local_size()),
                cross=(hvd.cross_rank(), hvd.cross_size()), total=total.tolist(),
                gathered=gathered.flatten().tolist(), host=os.environ["HVDLITE_HOSTNAME"])

executor = RayExecutor(SETTINGS, num_workers=4, cpus_per_worker=1)
executor.start()
results = executor.run(train, args=[2.0])
assert [r["rank"] for r in results] == [0, 1, 2, 3], results   # rank order
assert all(r["size"] == 4 and r["total"] == [20.0] * 3 and r["gathered"] == [0, 1, 2, 3] for r in results)
hosts = [r["host"] for r in results]
assert sorted(set(hosts)) == ["127.0.0.2", "127.0.0.3"], hosts
assert hosts[0] == hosts[1] and hosts[2] == hosts[3], f"co-located workers must get consecutive ranks: {hosts}"
assert [r["local"] for r in results] == [(0, 2), (1, 2), (0, 2), (1, 2)], results
assert [r["cross"] for r in results] == [(0, 2), (0, 2), (1, 2), (1, 2)], results
assert [n["ip"] for n in executor.nodes] == hosts

# A second function on the same job: hvd.init() again is a no-op, the runtime is still there.
assert executor.run(train, kwargs={"scale": 1.0})[3]["total"] == [10.0] * 3

# execute(): fn(executable) on the object every worker built in start()
executor.shutdown()
class Counter:
    def __init__(self, start):
        self.value = start
    def bump(self):
        self.value += 1
        return self.value
executor.start(executable_cls=Counter, executable_args=[10])
assert executor.execute(lambda c: c.bump()) == [11] * 4
assert executor.execute(lambda c: c.bump()) == [12] * 4
assert executor.execute_single(lambda c: c.value) == 12
executor.shutdown()

# Exactly two workers on each of two hosts
executor = RayExecutor(SETTINGS, num_hosts=2, num_workers_per_host=2, cpus_per_worker=1)
executor.start()
placed = executor.run(lambda: os.environ["HVDLITE_HOSTNAME"])
assert placed[0] == placed[1] != placed[2] == placed[3], placed
executor.shutdown()
""",
    )


def test_worker_failure_stops_the_job_and_names_the_rank(ray_cluster):
    _run_driver(
        ray_cluster,
        """
def unhappy_rank_two():
    import torch
    import hvdlite.torch as hvd
    hvd.init()
    if hvd.rank() == 2:
        raise ValueError("rank two is unhappy")
    hvd.allreduce(torch.ones(1), name="never_completes")  # the others wait here for rank 2

executor = RayExecutor(SETTINGS, num_workers=4)
executor.start()
started = time.monotonic()
try:
    executor.run(unhappy_rank_two)
except WorkerError as e:
    assert e.rank == 2, e
    assert "ValueError: rank two is unhappy" in str(e) and "unhappy_rank_two" in e.remote_traceback, str(e)
    assert isinstance(e.__cause__, ray.exceptions.RayTaskError)
else:
    raise SystemExit("the failure was not reported")
assert time.monotonic() - started < 30, "the blocked workers must be stopped, not waited for"
try:
    executor.run(lambda: 1)
except RuntimeError as e:
    assert "not started" in str(e)
else:
    raise SystemExit("a stopped executor ran a function")
executor.start()  # a new job on fresh workers
assert executor.run(lambda: __import__("hvdlite.torch").torch.init() or 7) == [7] * 4
executor.shutdown()

# More workers than the cluster has CPUs: a clear error, not a hang
executor = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=3), num_workers=5)
try:
    executor.start()
except TimeoutError as e:
    assert "did not grant 5 workers" in str(e), str(e)
else:
    raise SystemExit("5 workers started on 4 CPUs")
assert executor.workers == []
""",
    )


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

    jobs_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")
    script = f"""
import sys
sys.path.insert(0, {jobs_dir!r})
import ray
ray.init(address={ray_cluster!r}, _node_ip_address={HEAD!r}, log_to_driver=False,
         runtime_env={{"env_vars": {{"PYTHONPATH": {jobs_dir!r}}}}})
from hvdlite.ray import RayExecutor
import lifeline_job
executor = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=20), num_workers=2)
executor.start()
executor.run(lifeline_job.run_forever, args=[{str(tmp_path)!r}])
"""
    driver = subprocess.Popen(
        [sys.executable, "-c", script], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
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
