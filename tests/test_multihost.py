"""hvdlite-run across hosts, for real: two test hosts (network namespaces on a bridge, each with its own sshd,
see netns_cluster.py) and ranks started on them with the OpenSSH client.

These tests fail, not skip, when the machine cannot create the hosts: the reason is in the failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from launcher_helpers import COLLECTIVE_SCRIPT, LiveJob, processes_with_marker, run_launcher, wait_until, write_script
from netns_cluster import cluster_for_tests

PY = sys.executable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from cluster_for_tests(tmp_path_factory, 2, "the multi-host tests")


def namespace_of(pid: int) -> str:
    return subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, timeout=10
    ).stdout.strip()


@pytest.mark.timeout(60)
def test_each_test_host_writes_to_its_own_home(cluster):
    # The tests kill hosts mid-login; a lock an rc file takes in this machine's home would stall every later login.
    marker = "~/.hvdlite-home-probe-" + uuid.uuid4().hex
    a, b = cluster.hosts

    def on(host, command):
        return subprocess.run(
            ["ssh", "-F", cluster.ssh_config, host.alias, command], capture_output=True, text=True, timeout=30
        )

    wrote = on(a, "touch %s && test -e %s" % (marker, marker))
    assert wrote.returncode == 0, wrote.stderr
    assert on(b, "test -e " + marker).returncode == 1
    assert not os.path.exists(os.path.expanduser(marker))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["addresses", "aliases-and-interfaces", "local-and-remote"])
def test_collectives_across_two_hosts_over_ssh(cluster, tmp_path, how):
    a, b = cluster.hosts
    script = write_script(
        tmp_path,
        COLLECTIVE_SCRIPT
        + """
print("WHERE rank=%d host=%s rendezvous=%s token=%s" % (
    r, os.environ["HVDLITE_HOSTNAME"], os.environ["HVDLITE_RENDEZVOUS_ADDR"], os.environ["MY_TOKEN"]))
""",
    )
    if how == "addresses":
        # Hosts by address, with -p/-i and ssh options on the command line; every address found by routing.
        names = [a.address, b.address]
        flags = cluster.ssh_flags()
    elif how == "aliases-and-interfaces":
        # Hosts by ssh config alias; addresses from the interfaces (the bridge here, a veth in each host).
        names = [a.alias, b.alias]
        flags = ["--ssh-config-file", cluster.ssh_config, "--network-interface", ",".join(cluster.interfaces())]
    else:
        # Ranks 0 and 1 here, started directly; they must advertise an address the other host can reach.
        names = ["localhost", b.alias]
        flags = ["--ssh-config-file", cluster.ssh_config]
    result = run_launcher(
        ["-np", "4", "-H", "%s:2,%s:2" % tuple(names), *flags, "--start-timeout", "30", PY, script],
        timeout=90,
        env={"MY_TOKEN": "travels"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = {}
    for line in result.stdout.splitlines():
        match = re.fullmatch(
            r"\[(\d)\]<stdout>: OK rank=(\d) size=4 local=(\S+) cross=(\S+) shm_peers=(\d) "
            r"tcp_peers=(\d)",
            line,
        )
        if match:
            assert match.group(1) == match.group(2), line
            found[int(match.group(1))] = match.groups()[2:]
    # Two ranks per host: one peer through shared memory, two through TCP between the namespaces.
    assert found == {
        0: ("0/2", "0/2", "1", "2"),
        1: ("1/2", "0/2", "1", "2"),
        2: ("0/2", "1/2", "1", "2"),
        3: ("1/2", "1/2", "1", "2"),
    }, result.stdout + result.stderr
    for rank in range(4):
        assert (
            "[%d]<stdout>: WHERE rank=%d host=%s rendezvous=%s token=travels"
            % (rank, rank, names[rank // 2], cluster.gateway)
        ) in result.stdout.splitlines()


@pytest.mark.timeout(120)
def test_remote_failure_tears_down_every_host_and_keeps_the_secret_off_command_lines(cluster, tmp_path):
    marker = "hvdlite-multihost-test-" + uuid.uuid4().hex
    go = tmp_path / "go"
    script = write_script(
        tmp_path,
        """
        import os, subprocess, sys, time
        rank = int(os.environ["HVDLITE_RANK"])
        # Something in the rank's process group that would outlive a careless teardown.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[2]])
        print("ready pid=%d secret=%s" % (os.getpid(), os.environ["HVDLITE_SECRET"]), flush=True)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        if rank == 3:
            print("rank 3 gives up", flush=True)
            sys.exit(7)
        time.sleep(60)
        """,
    )
    # Hosts by alias from the generated ssh config.
    job = LiveJob(
        [
            "--ssh-config-file",
            cluster.ssh_config,
            "-H",
            "%s:2,%s:2" % (cluster.hosts[0].alias, cluster.hosts[1].alias),
            PY,
            script,
            str(go),
            marker,
        ]
    )
    try:
        ready = job.wait_for(lambda line: "<stdout>: ready pid=" in line, count=4, timeout=60)
        fields = [re.search(r"\[(\d)\]<stdout>: ready pid=(\d+) secret=([0-9a-f]+)", line).groups() for line in ready]
        pids = {int(rank): int(pid) for rank, pid, _ in fields}
        (secret,) = {secret for _, _, secret in fields}
        assert len(secret) == 64
        # Every rank runs inside its host's namespace...
        for rank, pid in pids.items():
            assert namespace_of(pid) == cluster.hosts[rank // 2].namespace, (rank, pid)
            assert pid in cluster.job_processes(cluster.hosts[rank // 2])
        # ...and no command line on the machine (ssh clients, sshd sessions, bash, ranks) carries the secret.
        assert processes_with_marker(secret) == []
        go.write_text("go")
        start = time.monotonic()
        code = job.finish(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        job.close()
    output = job.output()
    assert code == 7, output
    assert elapsed < 20, (elapsed, output)
    assert "[3]<stdout>: rank 3 gives up\n" in job.stdout
    assert (
        "hvdlite: rank 3 (on %s) exited with code 7; stopping the other ranks\n" % cluster.hosts[1].alias
        in job.stderr
    ), output
    # Nothing of the job is left on either host: ranks, their children, bash wrappers, sshd sessions.
    for host in cluster.hosts:
        assert wait_until(lambda: not cluster.job_processes(host), timeout=10), (
            host.namespace,
            [
                open("/proc/%d/cmdline" % p).read()
                for p in cluster.job_processes(host)
                if os.path.exists("/proc/%d" % p)
            ],
        )
    assert processes_with_marker(marker) == []


def test_unreachable_host_fails_with_ssh_hint(cluster, tmp_path):
    # A host address in the test subnet where nothing listens: ssh fails (exit 255) and says why.
    nobody = "10.123.%d.99" % cluster.net
    result = run_launcher(
        ["-np", "1", "-H", nobody + ":1", *cluster.ssh_flags(), "--start-timeout", "3", "true"], timeout=60
    )
    assert result.returncode == 255, result.stdout + result.stderr
    assert "rank 0 (on %s) exited with code 255 (255 is ssh's own failure code" % nobody in result.stderr


def received_bytes(link: str) -> int:
    with open("/sys/class/net/%s/statistics/rx_bytes" % link) as f:
        return int(f.read())


def bytes_sent_flat_and_two_tier(cluster, tmp_path, job: str, args, collective: str, two_tier_env=None) -> dict:
    """Runs tests/jobs/JOB on 2 hosts x 2 ranks, flat and then two-tier (HVDLITE_HIERARCHICAL_<COLLECTIVE>=0/1,
    with two_tier_env added; the other collective is forced flat too, so that no link measurement at init adds its
    own bytes); returns {"flat": [bytes host 0 sent, host 1], "two_tier": [...]}, counted where each host's link
    enters the bridge."""
    a, b = cluster.hosts
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", job)
    other = "ALLGATHER" if collective == "ALLREDUCE" else "ALLREDUCE"
    sent = {}
    for label, setting in (("flat", "0"), ("two_tier", "1")):
        before = [received_bytes(cluster.outside(i)) for i in range(2)]
        env = {"HVDLITE_HIERARCHICAL_" + collective: setting, "HVDLITE_HIERARCHICAL_" + other: "0"}
        if setting == "1":
            env.update(two_tier_env or {})
        result = run_launcher(
            [
                "-np",
                "4",
                "-H",
                "%s:2,%s:2" % (a.address, b.address),
                *cluster.ssh_flags(),
                PY,
                path,
                str(tmp_path),
                label,
                *map(str, args),
            ],
            timeout=150,
            env=env,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        sent[label] = [received_bytes(cluster.outside(i)) - before[i] for i in range(2)]
    print("bytes sent by each host (flat, two-tier):", sent)
    return sent


@pytest.mark.timeout(180)
def test_hierarchical_allreduce_matches_flat_and_sends_less_between_hosts(cluster, tmp_path):
    """2 hosts x 2 ranks, 8 MB allreduces, once flat and once two-tier (HVDLITE_HIERARCHICAL_ALLREDUCE=1).
    Integer results are equal bit for bit, float ones to rounding; on each host's link (counted where it
    enters the bridge) the two-tier run sends 2(H-1)/H = 1x the buffer per allreduce against the flat ring's
    2(N-1)/N = 1.5x, so about two thirds of the bytes. The two-tier run pipelines its tiers over chunks of an odd
    size (HVDLITE_HIERARCHICAL_PIPELINE_BYTES=999999: 9 uneven chunks of 8 MB, none of the 1001-element buffer)."""
    import numpy as np

    elements, repeats = 2 << 20, 4  # 8 MB of int32
    sent = bytes_sent_flat_and_two_tier(
        cluster,
        tmp_path,
        "two_tier_allreduce.py",
        [elements, repeats],
        "ALLREDUCE",
        two_tier_env={"HVDLITE_HIERARCHICAL_PIPELINE_BYTES": "999999"},
    )
    buffer_bytes = elements * 4
    allreduces = 2 + repeats  # ints, floats and the repeats; the small "odd" one is negligible
    for host in range(2):
        assert sent["flat"][host] >= 1.4 * buffer_bytes * allreduces, sent
        assert sent["two_tier"][host] <= 0.75 * sent["flat"][host], sent
    for rank in range(4):
        flat = np.load(tmp_path / ("flat.%d.npz" % rank))
        two_tier = np.load(tmp_path / ("two_tier.%d.npz" % rank))
        assert np.array_equal(flat["ints"], two_tier["ints"]) and np.array_equal(flat["odd"], two_tier["odd"])
        np.testing.assert_allclose(two_tier["floats"], flat["floats"], rtol=1e-5, atol=1e-5)
        rank0 = np.load(tmp_path / "two_tier.0.npz")
        assert np.array_equal(rank0["floats"], two_tier["floats"])  # identical on every rank


@pytest.mark.timeout(180)
def test_hierarchical_allgather_matches_flat_and_sends_less_between_hosts(cluster, tmp_path):
    """2 hosts x 2 ranks, ~8 MB allgathers of rows (a different count on every rank), flat and two-tier
    (HVDLITE_HIERARCHICAL_ALLGATHER=1). The results are equal bit for bit and in rank order; each host's link
    carries the other host's data once, 1/2 of the output, against the flat ring's 3/4 (two thirds of the bytes)."""
    import numpy as np

    rows, repeats = 2048, 4  # 4 ranks x ~2 MB each
    sent = bytes_sent_flat_and_two_tier(cluster, tmp_path, "two_tier_allgather.py", [rows, repeats], "ALLGATHER")
    output_bytes = (4 * rows + 6) * 256 * 4
    for host in range(2):
        assert sent["flat"][host] >= 0.7 * output_bytes * (1 + repeats), sent
        assert sent["two_tier"][host] <= 0.75 * sent["flat"][host], sent
    expected = np.concatenate(
        [np.random.default_rng(200 + r).integers(-1000, 1000, (rows + r, 256), dtype=np.int32) for r in range(4)]
    )
    for rank in range(4):
        for label in ("flat", "two_tier"):
            assert np.array_equal(np.load(tmp_path / ("%s.%d.npy" % (label, rank))), expected), (label, rank)


def allreduce_activities(timeline_path: str) -> dict:
    """Tensor name -> the activities its allreduces ran as, from rank 0's timeline."""
    from hvdlite.timeline import activities, load

    return activities(load(timeline_path), "ALLREDUCE")


# Alone: a speed ratio of two runs, each a fraction of a second at 16 MB, which the other lane's jobs would skew.
@pytest.mark.alone
@pytest.mark.timeout(240)
@pytest.mark.parametrize("per_host", [2, 4])
def test_hierarchical_allreduce_on_a_slow_link_is_faster_and_runs_by_default(cluster, tmp_path, per_host):
    """2 hosts x 2 and x 4 ranks, each host's link limited to 1 Gbit/s both ways (tc tbf). Flat and default (with a
    timeline) runs of 1, 16 and 64 MB allreduces. The default runs two tiers at every size, and they must be faster
    at 16 and 64 MB: they cut the bytes on each host's link from the flat ring's 2(N-1)/N of the buffer to
    2(H-1)/H, a bound of 1.5x on 2 x 2 and 1.75x on 2 x 4; 1.6x is asserted where the bound allows it (2 x 4), and
    1.4x on 2 x 2. The speedups are printed and recorded in docs/hierarchical.md."""
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "allreduce_timing.py")
    a, b = cluster.hosts
    sizes = [1 << 20, 16 << 20, 64 << 20]
    for index in range(2):
        cluster.limit_rate(index, "1gbit")
    try:
        runs = {}
        for label, env in (
            ("flat", {"HVDLITE_HIERARCHICAL_ALLREDUCE": "0", "HVDLITE_ALLREDUCE_ALGORITHMS": "ring"}),
            ("default", {"HVDLITE_TIMELINE": str(tmp_path / "timeline.json")}),
        ):
            out = tmp_path / ("%s.json" % label)
            result = run_launcher(
                [
                    "-np",
                    str(2 * per_host),
                    "-H",
                    "%s:%d,%s:%d" % (a.address, per_host, b.address, per_host),
                    *cluster.ssh_flags(),
                    PY,
                    job,
                    str(out),
                    ",".join(map(str, sizes)),
                    "2",
                ],
                timeout=150,
                env=env,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            with open(out) as f:
                runs[label] = json.load(f)
    finally:
        for index in range(2):
            cluster.limit_rate(index, None)
    best = {label: {int(size): min(times) for size, times in run["times"].items()} for label, run in runs.items()}
    print("best of 2 (s):", best)
    for size in (16 << 20, 64 << 20):
        assert best["flat"][size] / best["default"][size] >= (1.6 if per_host == 4 else 1.4), best
    ran = allreduce_activities(str(tmp_path / "timeline.json"))
    for size in sizes:
        assert ran["allreduce.%d" % size] == {"ALLREDUCE (hierarchical)"}, ran


@pytest.mark.timeout(120)
def test_a_rank_killed_during_pipelined_two_tier_allreduces_fails_the_others_promptly(cluster, tmp_path):
    """2 hosts x 2 ranks running 16 MB two-tier allreduces pipelined over 64 chunks (each rank runs its host tiers
    and, on a helper thread, its network tier at once); rank 3 is killed mid-run. Every survivor's allreduce fails
    within 6 s (the 5 s no-progress timeout is the longest path: a network-tier partner whose host-mate failed),
    naming rank 3, and the job ends: no pipeline thread is left waiting."""
    import signal

    from launcher_helpers import hvdlite_run
    from multiproc import job_env

    a, b = cluster.hosts
    out = tmp_path / "killed"
    out.mkdir()
    trial = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "fault_trial.py")
    env = job_env({"HVDLITE_HIERARCHICAL_ALLREDUCE": "1", "HVDLITE_HIERARCHICAL_PIPELINE_BYTES": str(256 << 10)})
    launcher = subprocess.Popen(
        [
            hvdlite_run(),
            "-np",
            "4",
            "-H",
            "%s:2,%s:2" % (a.address, b.address),
            *cluster.ssh_flags(),
            PY,
            trial,
            str(out),
            "3",
            "sigkill",
            str(4 << 20),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: sum(name.startswith("running.") for name in os.listdir(out)) == 4, 60), (
            "the ranks never got going"
        )
        killed_at = time.time()
        os.kill(int((out / "pid.3").read_text()), signal.SIGKILL)
        output, _ = launcher.communicate(timeout=40)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode != 0, output
    for rank in range(3):
        path = out / ("error.%d" % rank)
        assert path.exists(), "rank %d saw no error\n%s" % (rank, output[-4000:])
        error = json.loads(path.read_text())
        assert "rank 3" in error["message"], (rank, error)
        assert error["time"] - killed_at <= 6.0, (rank, error["time"] - killed_at, error)
        print("rank %d failed %.2f s after the kill: %s" % (rank, error["time"] - killed_at, error["message"][:160]))
