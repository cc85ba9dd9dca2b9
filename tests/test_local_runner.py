"""Tests for the local N-rank starter (hvdlite.runner.local)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from launcher_helpers import HOROVOD_VARIABLES_SCRIPT, check_horovod_variables, processes_with_marker
from multiproc import REPO_ROOT, job_env

from hvdlite.runner.hosts import compute_topology
from hvdlite.runner.processes import build_rank_env

PRINT_ENV = """
    import os
    keys = ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
            "CROSS_SIZE", "HOSTNAME"]
    print(" ".join("%s=%s" % (k, os.environ["HVDLITE_" + k]) for k in keys))
"""


def parse_env_lines(stdout):
    """{rank: {KEY: value}} from the prefixed PRINT_ENV lines."""
    found = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\[(\d+)\]<stdout>: (RANK=.*)", line)
        if match:
            fields = dict(kv.split("=", 1) for kv in match.group(2).split())
            assert int(match.group(1)) == int(fields["RANK"])
            found[int(fields["RANK"])] = fields
    return found


def assert_no_leftovers(marker, within=2.0):
    deadline = time.monotonic() + within
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with_marker(marker) == []


def test_topology_and_env():
    infos = compute_topology(3, ["a", "b", "a"])
    assert [(i.local_rank, i.local_size, i.cross_rank, i.cross_size, i.hostname) for i in infos] == [
        (0, 2, 0, 2, "hosta"),
        (0, 1, 1, 2, "hostb"),
        (1, 2, 0, 2, "hosta"),
    ]
    env = build_rank_env(
        infos[2],
        rendezvous_addr="127.0.0.1",
        rendezvous_port=4242,
        secret=b"\x01\xff",
        job_id="abc",
        base_env={"KEEP": "1"},
    )
    assert env == {
        "KEEP": "1",
        "HVDLITE_RANK": "2",
        "HVDLITE_SIZE": "3",
        "HVDLITE_LOCAL_RANK": "1",
        "HVDLITE_LOCAL_SIZE": "2",
        "HVDLITE_CROSS_RANK": "0",
        "HVDLITE_CROSS_SIZE": "2",
        "HVDLITE_HOSTNAME": "hosta",
        "HVDLITE_RENDEZVOUS_ADDR": "127.0.0.1",
        "HVDLITE_RENDEZVOUS_PORT": "4242",
        "HVDLITE_SECRET": "01ff",
        "HVDLITE_JOB_ID": "abc",
        "PYTHONUNBUFFERED": "1",
        "HOROVOD_RANK": "2",
        "HOROVOD_SIZE": "3",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "0",
        "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_HOSTNAME": "hosta",
    }
    with pytest.raises(ValueError):
        compute_topology(2, [0])


def test_three_ranks_env_and_prefixes(run_job):
    script = (
        PRINT_ENV
        + """
    import sys
    print("to stderr", file=sys.stderr)
    print("rendezvous", os.environ["HVDLITE_RENDEZVOUS_ADDR"],
          os.environ["HVDLITE_RENDEZVOUS_PORT"], len(os.environ["HVDLITE_SECRET"]),
          os.environ["HVDLITE_JOB_ID"], os.environ["PYTHONUNBUFFERED"])
    """
    )
    result = run_job(script, np=3, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    found = parse_env_lines(result.stdout)
    assert sorted(found) == [0, 1, 2]
    for rank, fields in found.items():
        assert fields == {
            "RANK": str(rank),
            "SIZE": "3",
            "LOCAL_RANK": str(rank),
            "LOCAL_SIZE": "3",
            "CROSS_RANK": "0",
            "CROSS_SIZE": "1",
            "HOSTNAME": "localhost",
        }
    for rank in range(3):
        assert "[%d]<stderr>: to stderr" % rank in result.stderr.splitlines()
    # Same rendezvous server and job id for every rank; 32-byte secret.
    rdv = {line.split(": ", 1)[1] for line in result.stdout.splitlines() if "rendezvous" in line}
    assert len(rdv) == 1
    _, addr, port, secret_len, job_id, unbuffered = rdv.pop().split()
    assert addr == "127.0.0.1" and int(port) > 0
    assert secret_len == "64" and len(job_id) == 12 and unbuffered == "1"


def test_host_ids_give_local_and_cross_ranks(run_job):
    result = run_job(PRINT_ENV, np=4, host_ids=[0, 0, 1, 1], timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    found = parse_env_lines(result.stdout)
    assert [found[r]["LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
    assert [found[r]["CROSS_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
    assert {found[r]["CROSS_SIZE"] for r in range(4)} == {"2"}
    assert {found[r]["LOCAL_SIZE"] for r in range(4)} == {"2"}
    assert [found[r]["HOSTNAME"] for r in range(4)] == ["host0", "host0", "host1", "host1"]


def test_horovod_variables_with_host_ids(run_job):
    result = run_job(HOROVOD_VARIABLES_SCRIPT, np=3, host_ids=[0, 0, 1], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    check_horovod_variables(result.stdout, ["host0", "host0", "host1"])


def test_failing_rank_stops_the_others(run_job):
    marker = "hvdlite-test-marker-" + uuid.uuid4().hex
    script = """
    import os, subprocess, sys, time
    rank = int(os.environ["HVDLITE_RANK"])
    if rank == 1:
        time.sleep(0.5)
        print("rank 1 failing", flush=True)
        sys.exit(3)
    # A grandchild in the rank's process group must go away as well.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                      sys.argv[1]])
    time.sleep(60)
    """
    start = time.monotonic()
    result = run_job(script, np=3, timeout=60, args=[marker])
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.stdout + result.stderr
    assert elapsed < 15, elapsed
    assert "[1]<stdout>: rank 1 failing" in result.stdout
    assert "hvdlite: rank 1 exited with code 3; stopping the other ranks" in result.stderr
    assert_no_leftovers(marker)


def test_output_filename_writes_per_rank_files(run_job, tmp_path):
    out_dir = tmp_path / "logs"
    script = """
    import os, sys
    rank = os.environ["HVDLITE_RANK"]
    print("out of", rank)
    print("err of", rank, file=sys.stderr)
    """
    # run_job has no option for it; call the starter directly.
    script_path = tmp_path / "script.py"
    script_path.write_text(textwrap.dedent(script))
    cmd = [
        sys.executable,
        "-m",
        "hvdlite.runner.local",
        "-np",
        "2",
        "--output-filename",
        str(out_dir),
        "--timeout",
        "30",
        "--",
        sys.executable,
        str(script_path),
    ]
    result = subprocess.run(cmd, cwd=REPO_ROOT, env=job_env(), text=True, capture_output=True, timeout=45)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        rank_dir = out_dir / ("rank.%d" % rank)
        assert (rank_dir / "stdout").read_text() == "out of %d\n" % rank
        assert (rank_dir / "stderr").read_text() == "err of %d\n" % rank
        assert "[%d]<stdout>: out of %d" % (rank, rank) in result.stdout


def test_timeout_kills_hanging_job(run_job):
    marker = "hvdlite-test-marker-" + uuid.uuid4().hex
    script = """
    import time
    print("started", flush=True)
    time.sleep(60)
    """
    start = time.monotonic()
    result = run_job(script, np=2, timeout=1.5, args=[marker])
    elapsed = time.monotonic() - start
    assert result.returncode == 124, result.stdout + result.stderr
    assert elapsed < 10, elapsed
    assert "timeout" in result.stderr
    assert_no_leftovers(marker)


def test_signal_to_starter_stops_ranks(tmp_path):
    marker = "hvdlite-test-marker-" + uuid.uuid4().hex
    script_path = tmp_path / "script.py"
    script_path.write_text("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    cmd = [
        sys.executable,
        "-m",
        "hvdlite.runner.local",
        "-np",
        "2",
        "--timeout",
        "30",
        "--",
        sys.executable,
        str(script_path),
        marker,
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        ready = 0
        deadline = time.monotonic() + 20
        while ready < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            ready += line.endswith("ready\n")
        assert ready == 2
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "received SIGTERM" in stderr
    assert_no_leftovers(marker)


def test_command_not_found():
    cmd = [sys.executable, "-m", "hvdlite.runner.local", "-np", "2", "--", "/nonexistent/hvdlite-no-such-command"]
    result = subprocess.run(cmd, cwd=REPO_ROOT, env=job_env(), text=True, capture_output=True, timeout=30)
    assert result.returncode == 127
    assert "failed to start" in result.stderr


def test_ranks_can_rendezvous(run_job):
    script = """
    import os
    from hvdlite.common.rendezvous import client_from_env, exchange_all
    rank, size = int(os.environ["HVDLITE_RANK"]), int(os.environ["HVDLITE_SIZE"])
    values = exchange_all(client_from_env(), "addrs", rank, size,
                          b"addr-%d" % rank, timeout=20)
    print("got", b",".join(values).decode())
    """
    result = run_job(script, np=3, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(3):
        assert "[%d]<stdout>: got addr-0,addr-1,addr-2" % rank in result.stdout.splitlines()
