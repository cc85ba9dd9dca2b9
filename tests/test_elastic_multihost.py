"""Elastic training across hosts: hvdlite-run --host-discovery-script with workers started over ssh on two
network-namespace test hosts (netns_cluster.py), one slot each, while the discovery output goes from two hosts to
one and back to two.

The workers run tests/jobs/elastic_train.py (as in test_elastic.py); they share this machine's filesystem, so their
logs land in the test's directory. The test fails, not skips, when the machine cannot create the hosts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from launcher_helpers import hvdlite_run, wait_until
from multiproc import job_env
from netns_cluster import cluster_for_tests
from test_elastic import JOB, check_epochs_cover_every_sample, events, finish, wait_for

INTERVAL = 0.5  # --discovery-interval
EPOCHS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from cluster_for_tests(tmp_path_factory, 2, "the elastic multi-host test")


def namespace_of(pid: int) -> str:
    return subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, timeout=10
    ).stdout.strip()


def rounds(log) -> list:
    """(time, size) of each round a worker's log shows."""
    return [(e["time"], e["size"]) for e in log if e["event"] == "round"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["addresses", "localhost-and-alias"])
def test_elastic_rounds_follow_hosts_leaving_and_coming_back(cluster, tmp_path, how):
    """Discovery prints hosts a and b (one slot each), then only a, then a and b again: the rounds have 2, 1 and 2
    workers, each change within a discovery interval plus a commit (plus, for the new worker, its start over ssh);
    b's first worker, stopped because b left the output, is not a failure; the job exits 0 and the final weights
    equal the replayed schedule.

    ``addresses``: both hosts are test hosts, named by address, with -p/-i on the command line.
    ``localhost-and-alias``: a is this machine (its worker started directly, not over ssh; it must advertise an
    address b's workers can reach, not loopback) and b is named by its alias in the generated ssh config."""
    if how == "addresses":
        a, b = cluster.hosts[0].address, cluster.hosts[1].address
        a_namespace, flags = cluster.hosts[0].namespace, cluster.ssh_flags()
    else:
        a, b = "localhost", cluster.hosts[1].alias
        a_namespace, flags = "", ["--ssh-config-file", cluster.ssh_config]  # "": this machine's own namespace
    b_namespace = cluster.hosts[1].namespace
    both = f"{a}:1\n{b}:1\n"
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(both)
    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    discover.chmod(0o755)
    cmd = [
        hvdlite_run(),
        "-np",
        "2",
        "--min-np",
        "1",
        "--max-np",
        "2",
        "--host-discovery-script",
        str(discover),
        "--discovery-interval",
        str(INTERVAL),
        *flags,
        sys.executable,
        JOB,
        str(logs_dir),
        str(EPOCHS),
    ]
    began = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:

        def w0():
            return events(logs_dir).get("w0", [])

        wait_for(lambda: any(e["event"] == "batch" and e["batches"] >= 5 for e in w0()), 90, "w0 to commit 5 batches")
        # Each worker runs inside its host's namespace (started over ssh), w0 on a and w1 on b.
        for worker, namespace in (("w0", a_namespace), ("w1", b_namespace)):
            assert namespace_of(events(logs_dir)[worker][0]["pid"]) == namespace, (worker, namespace)
        shrink = time.time()
        hosts_file.write_text(f"{a}:1\n")
        wait_for(lambda: any(size == 1 for _, size in rounds(w0())), 60, "a round of 1 worker")
        shrunk_after = next(t for t, size in rounds(w0()) if size == 1) - shrink
        wait_for(lambda: any(e["event"] == "batch" and e["size"] == 1 for e in w0()), 60, "a batch in the round of 1")
        grow = time.time()
        hosts_file.write_text(both)
        wait_for(lambda: any(size == 2 and t > grow for t, size in rounds(w0())), 60, "a round of 2 workers again")
        grown_after = next(t for t, size in rounds(w0()) if size == 2 and t > grow) - grow
        w2_start = next(e for e in events(logs_dir)["w2"] if e["event"] == "start")
        assert namespace_of(w2_start["pid"]) == b_namespace  # still running: the job is far from done
        new_start = w2_start["time"] - grow
        out = finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    elapsed = time.monotonic() - began
    print(
        f"shrunk after {shrunk_after:.2f} s, new worker started after {new_start:.2f} s, grown after "
        f"{grown_after:.2f} s, job {elapsed:.1f} s"
    )
    assert proc.returncode == 0, out[-5000:]
    # Removal: one discovery interval, then w1 is stopped at once and w0's collective fails (its peer's sockets
    # close), w0 rolls back to its last commit and re-forms alone. Addition: one discovery interval, the new
    # worker's start over ssh (python, torch, hvd.init), then w0's next commit. The slack is a loaded 2-core machine.
    # Measured on 2 loaded cores: shrunk 0.1-0.6 s, new worker's first line 1.8-3 s, round 0.1 s after it.
    assert shrunk_after < INTERVAL + 5, (shrunk_after, out[-3000:])
    assert new_start < INTERVAL + 10, (new_start, out[-3000:])
    assert grown_after - new_start < 5, (grown_after, new_start, out[-3000:])
    assert f"host {b} is gone from the discovery output; stopping worker w1" in out, out[-5000:]
    assert "exited with code" not in out and "blacklisted" not in out, out[-5000:]
    assert "elastic round 0: 2 worker(s)" in out and "elastic round 1: 1 worker(s)" in out, out[-5000:]
    assert "elastic round 2: 2 worker(s)" in out and "elastic round 3" not in out, out[-5000:]
    logs = events(logs_dir)
    assert set(logs) == {"w0", "w1", "w2"}, set(logs)
    assert [size for _, size in rounds(logs["w0"])] == [2, 1, 2], rounds(logs["w0"])
    assert not any(e["event"] == "done" for e in logs["w1"])
    done = {w: next(e for e in log if e["event"] == "done") for w, log in logs.items() if w != "w1"}
    assert done["w0"]["sizes"] == [2, 1, 2], done["w0"]
    assert done["w2"]["sizes"] == [2], done["w2"]
    assert len({tuple(d["weights"]) for d in done.values()}) == 1, "the workers finished with different models"
    assert len({d["batches"] for d in done.values()}) == 1
    check_epochs_cover_every_sample(logs, epochs=EPOCHS)
    replayed = subprocess.run(
        [sys.executable, JOB, "--replay", str(logs_dir)], env=job_env(), capture_output=True, text=True, timeout=120
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    reference = json.loads(replayed.stdout.strip().splitlines()[-1])
    assert reference["steps"] == done["w0"]["batches"], (reference["steps"], done["w0"]["batches"])
    assert all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(done["w0"]["weights"], reference["weights"])), (
        done["w0"]["weights"],
        reference["weights"],
    )
    # Nothing of the job is left on either test host (workers, bash wrappers, sshd sessions).
    for host in cluster.hosts:
        assert wait_until(lambda: not cluster.job_processes(host), timeout=10), (
            host.namespace,
            cluster.job_processes(host),
        )
