"""End-to-end tests of hvdlite-run on this machine (built-in mode) and of hvdlite.run(fn).

Multi-host jobs over ssh are in test_multihost.py, attacks on a running job in test_launcher_security.py,
--mpi in test_mpi_bootstrap.py.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid

import pytest
from launcher_helpers import (
    COLLECTIVE_SCRIPT,
    HOROVOD_VARIABLES_SCRIPT,
    LiveJob,
    TmuxPane,
    check_horovod_variables,
    hvdlite_run,
    processes_with_marker,
    run_launcher,
    wait_until,
    write_script,
)
from multiproc import job_env

import hvdlite
from hvdlite.runner.api import RunError

PY = sys.executable


def ok_lines(stdout: str):
    """{rank: fields} from the COLLECTIVE_SCRIPT lines, checking each line's rank prefix."""
    found = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\[(\d+)\]<stdout>: OK (.*)", line)
        if match:
            fields = dict(kv.split("=", 1) for kv in match.group(2).split())
            assert fields["rank"] == match.group(1), line
            found[int(fields["rank"])] = fields
    return found


@pytest.mark.timeout(60)
def test_failing_rank_sets_exit_code_and_stops_everything(tmp_path):
    marker = "hvdlite-launcher-test-" + uuid.uuid4().hex
    script = write_script(
        tmp_path,
        """
        import os, subprocess, sys, time
        rank = int(os.environ["HVDLITE_RANK"])
        print("hello from", rank, flush=True)
        print("note from", rank, file=sys.stderr, flush=True)
        if rank == 1:
            time.sleep(1.0)
            sys.exit(3)
        # A grandchild in the rank's process group must go as well.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]])
        time.sleep(60)
        """,
    )
    start = time.monotonic()
    result = run_launcher(["-np", "3", PY, script, marker], timeout=45)
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.stdout + result.stderr
    assert elapsed < 20, elapsed
    for rank in range(3):
        assert "[%d]<stdout>: hello from %d" % (rank, rank) in result.stdout.splitlines()
        assert "[%d]<stderr>: note from %d" % (rank, rank) in result.stderr.splitlines()
    assert "hvdlite: rank 1 exited with code 3; stopping the other ranks" in result.stderr
    assert wait_until(lambda: not processes_with_marker(marker), timeout=3), processes_with_marker(marker)


@pytest.mark.timeout(60)
def test_success_flags_reach_the_ranks_and_output_files(tmp_path):
    logs = tmp_path / "logs"
    script = write_script(
        tmp_path,
        """
        import os, sys
        names = ["RANK", "SIZE", "LOCAL_RANK", "CROSS_SIZE", "FUSION_THRESHOLD", "CYCLE_TIME", "CACHE_CAPACITY",
                 "TIMELINE", "LOG_LEVEL", "START_TIMEOUT"]
        print(" ".join("%s=%s" % (n, os.environ["HVDLITE_" + n]) for n in names), os.environ["MY_VARIABLE"])
        print("err", os.environ["HVDLITE_RANK"], file=sys.stderr)
        """,
    )
    timeline = str(tmp_path / "timeline.json")
    result = run_launcher(
        [
            "-np",
            "2",
            "--fusion-threshold-mb",
            "2",
            "--cycle-time-ms",
            "2.5",
            "--cache-capacity",
            "7",
            "--timeline-filename",
            timeline,
            "--log-level",
            "debug",
            "--start-timeout",
            "33",
            "--output-filename",
            str(logs),
            PY,
            script,
        ],
        env={"MY_VARIABLE": "propagated"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        expected = (
            "RANK=%d SIZE=2 LOCAL_RANK=%d CROSS_SIZE=1 FUSION_THRESHOLD=2097152 CYCLE_TIME=2.5 "
            "CACHE_CAPACITY=7 TIMELINE=%s LOG_LEVEL=debug START_TIMEOUT=33 propagated" % (rank, rank, timeline)
        )
        assert "[%d]<stdout>: %s" % (rank, expected) in result.stdout.splitlines()
        assert (logs / ("rank.%d" % rank) / "stdout").read_text() == expected + "\n"
        assert (logs / ("rank.%d" % rank) / "stderr").read_text() == "err %d\n" % rank


@pytest.mark.timeout(60)
def test_collectives_with_hosts_flag(tmp_path):
    script = write_script(tmp_path, COLLECTIVE_SCRIPT)
    result = run_launcher(["-np", "2", "-H", "localhost:2", PY, script])
    assert result.returncode == 0, result.stdout + result.stderr
    found = ok_lines(result.stdout)
    assert sorted(found) == [0, 1], result.stdout + result.stderr
    for rank, fields in found.items():
        assert (fields["local"], fields["cross"], fields["shm_peers"]) == ("%d/2" % rank, "0/1", "1")


@pytest.mark.timeout(60)
def test_horovod_variables_are_exported(tmp_path):
    script = write_script(tmp_path, HOROVOD_VARIABLES_SCRIPT)
    result = run_launcher(["-np", "3", PY, script])
    assert result.returncode == 0, result.stdout + result.stderr
    check_horovod_variables(result.stdout, ["localhost"] * 3)


@pytest.mark.timeout(60)
def test_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# test hosts\nlocalhost slots=3   # this machine\n\n")
    script = write_script(
        tmp_path,
        """
        import os
        print("rank", os.environ["HVDLITE_RANK"], "of", os.environ["HVDLITE_SIZE"], "on",
              os.environ["HVDLITE_HOSTNAME"], os.environ["HVDLITE_LOCAL_SIZE"])
        """,
    )
    result = run_launcher(["--hostfile", str(hostfile), PY, script])  # no -np: every slot
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(3):
        assert "[%d]<stdout>: rank %d of 3 on localhost 3" % (rank, rank) in result.stdout.splitlines()

    too_many = run_launcher(["-np", "4", "--hostfile", str(hostfile), PY, script])
    assert too_many.returncode == 2
    assert "requested 4 processes but the hosts have only 3 slots (localhost:3)" in too_many.stderr


def test_check_build():
    result = run_launcher(["--check-build"], timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "hvdlite v%s:" % hvdlite.__version__
    for expected in (
        "    [X] PyTorch",
        "    [X] TCP",
        "    [X] shared memory",
        "    [X] compiled (cffi API mode)",
        "    [X] per-tensor calls in C (hvdlite._fast_calls)",
    ):
        assert expected in lines, result.stdout
    # No GPU here: the NCCL row says why (tests/test_nccl_data_plane.py checks the usable case on a fake NCCL).
    assert any(line.startswith("    [ ] NCCL: ") for line in lines), result.stdout


def test_usage_errors(tmp_path):
    no_command = run_launcher(["-np", "2"], timeout=30)
    assert no_command.returncode == 2 and "no command given" in no_command.stderr
    bad_hosts = run_launcher(["-H", "a:zero", "true"], timeout=30)
    assert bad_hosts.returncode == 2 and "slots must be a positive integer" in bad_hosts.stderr
    missing = run_launcher(["-np", "1", "/nonexistent/hvdlite-no-such-command"], timeout=30)
    assert missing.returncode == 127 and "failed to start" in missing.stderr


@pytest.mark.timeout(60)
def test_ctrl_c_stops_every_rank(tmp_path):
    marker = "hvdlite-launcher-test-" + uuid.uuid4().hex
    script = write_script(tmp_path, "import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    job = LiveJob(["-np", "2", PY, script, marker])
    try:
        job.wait_for(lambda line: line.endswith("ready\n"), count=2)
        job.proc.send_signal(signal.SIGINT)
        code = job.finish(timeout=20)
    finally:
        job.close()
    assert code == 128 + signal.SIGINT, job.output()
    assert "received SIGINT" in "".join(job.stderr)
    assert wait_until(lambda: not processes_with_marker(marker), timeout=3)


@pytest.mark.timeout(60)
def test_closing_the_terminal_stops_every_rank(tmp_path):
    # The ranks have their own sessions: the terminal's SIGHUP reaches only the launcher, which stops them.
    marker = "hvdlite-launcher-test-" + uuid.uuid4().hex
    script = write_script(tmp_path, "import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    pane = TmuxPane(" ".join(shlex.quote(arg) for arg in [hvdlite_run(), "-np", "2", PY, script, marker]))
    try:
        pane.wait_for_screen(lambda lines: sum(line.endswith("<stdout>: ready") for line in lines) == 2)
        assert len(processes_with_marker(marker)) >= 2  # the ranks (and the launcher, the shell, tmux)
    finally:
        pane.close()
    assert wait_until(lambda: not processes_with_marker(marker), timeout=10), processes_with_marker(marker)


def test_sighup_stays_ignored_under_nohup():
    from hvdlite.runner.processes import SignalCatcher

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with SignalCatcher() as catcher:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == catcher._handle
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.timeout(90)
def test_run_function_returns_results_in_rank_order(capfd):
    def train(scale, offset=0):
        import os

        import torch

        import hvdlite.torch as hvd

        hvd.init()
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
        print("rank", hvd.rank(), "done")
        return {"rank": hvd.rank(), "value": total * scale + offset, "HOROVOD_RANK": os.environ["HOROVOD_RANK"]}

    results = hvdlite.run(train, args=(10,), kwargs={"offset": 1}, num_proc=2, timeout=60)  # horovod.run's name
    assert results == [
        {"rank": 0, "value": 31.0, "HOROVOD_RANK": "0"},
        {"rank": 1, "value": 31.0, "HOROVOD_RANK": "1"},
    ]
    assert "[1]<stdout>: rank 1 done" in capfd.readouterr().out.splitlines()


@pytest.mark.timeout(60)
def test_run_function_raises_with_the_failing_ranks_traceback():
    def fail_on_rank_one():
        import os
        import time

        if os.environ["HVDLITE_RANK"] == "1":
            raise ValueError("rank one cannot go on")
        time.sleep(60)

    with pytest.raises(RunError) as info:
        hvdlite.run(fail_on_rank_one, np=2, timeout=45)
    assert info.value.rank == 1 and info.value.exit_code == 1
    assert "ValueError: rank one cannot go on" in info.value.remote_traceback
    assert "in fail_on_rank_one" in str(info.value)


def test_hvdlite_package_stays_light():
    # `import hvdlite` (and so every rank's and hvdlite-run's startup) imports no framework and no launcher;
    # hvdlite.run is loaded on first use.
    code = (
        "import sys, hvdlite; before = [m for m in ('torch', 'hvdlite.runner.api') if m in sys.modules]; "
        "run = hvdlite.run; print(before, run.__module__, 'torch' in sys.modules)"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=30, env=job_env())
    assert out.stdout.split() == ["[]", "hvdlite.runner.api", "False"], out.stderr


KNOB_JOB = """
    from hvdlite.common import basics
    basics.init()
    info = dict(item.split("=", 1) for item in basics.build_info().split(";") if "=" in item)
    names = %r
    print("KNOBS", basics.rank(), " ".join("%%s=%%s" %% (n, info[n]) for n in names), flush=True)
    basics.shutdown()
"""


HOROVODRUN_CONFIG = """
params: {fusion_threshold_mb: 2, cycle_time_ms: 9, cache_capacity: 7, hierarchical_allreduce: false,
         hierarchical_allgather: true}
autotune: {enabled: true, log_file: %s, warmup_samples: 2}
timeline: {mark_cycles: true}
stall_check: {enabled: true, warning_time_seconds: 7, shutdown_time_seconds: 9}
library_options: {gloo_timeout_seconds: 33}
logging: {level: ERROR, hide_timestamp: true}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["flags", "config-file"])
def test_horovodrun_knob_flags_reach_every_rank_s_core(tmp_path, source):
    """What each rank's core read at init (its build_info), for horovodrun's tuning flags given together, or
    given by horovodrun's YAML (--config-file) where a flag on the command line wins."""
    names = [
        "FUSION_THRESHOLD",
        "CYCLE_TIME",
        "CACHE_CAPACITY",
        "HIERARCHICAL_ALLREDUCE",
        "HIERARCHICAL_ALLGATHER",
        "AUTOTUNE",
        "AUTOTUNE_LOG",
        "AUTOTUNE_WARMUP_WINDOWS",
        "TIMELINE_MARK_CYCLES",
        "STALL_CHECK_TIME_SECONDS",
        "STALL_SHUTDOWN_TIME_SECONDS",
        "LOG_LEVEL",
        "LOG_HIDE_TIME",
        "SHM_DISABLE",
        "CMA_DISABLE",
        "START_TIMEOUT",
        "shm_peers",
        "tcp_peers",
    ]
    script = write_script(tmp_path, KNOB_JOB % names)
    tune_log = str(tmp_path / "tune.csv")
    flags = [
        "--fusion-threshold-mb",
        "2",
        "--cycle-time-ms",
        "2.5",
        "--cache-capacity",
        "7",
        "--no-hierarchical-allreduce",
        "--hierarchical-allgather",
        "--autotune",
        "--autotune-log-file",
        tune_log,
        "--autotune-warmup-samples",
        "2",
        "--timeline-mark-cycles",
        "--stall-check-warning-time-seconds",
        "7",
        "--stall-check-shutdown-time-seconds",
        "9",
        "--log-level",
        "ERROR",
        "--log-without-timestamp",
        "--tcp",
        "--gloo-timeout-seconds",
        "33",
    ]
    if source == "config-file":
        config = tmp_path / "horovod.yaml"
        config.write_text(HOROVODRUN_CONFIG % tune_log)
        flags = ["--config-file", str(config), "--cycle-time-ms", "2.5", "--tcp", "--prefix-output-with-timestamp"]
    result = run_launcher(["-np", "2", *flags, PY, script], timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    if source == "config-file":  # time.asctime() before each rank line, as horovodrun's
        stamped = re.compile(r"(\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4})\[(\d)\]<stdout>: (KNOBS .*)")
        lines = [stamped.fullmatch(line) for line in result.stdout.splitlines() if "KNOBS" in line]
        assert len(lines) == 2 and all(lines), result.stdout
        result.stdout = "\n".join("[%s]<stdout>: %s" % (m.group(2), m.group(3)) for m in lines)
    expected = (
        "FUSION_THRESHOLD=2097152 CYCLE_TIME=2.5 CACHE_CAPACITY=7 HIERARCHICAL_ALLREDUCE=0 "
        "HIERARCHICAL_ALLGATHER=1 AUTOTUNE=1 AUTOTUNE_LOG=%s AUTOTUNE_WARMUP_WINDOWS=2 TIMELINE_MARK_CYCLES=1 "
        "STALL_CHECK_TIME_SECONDS=7 STALL_SHUTDOWN_TIME_SECONDS=9 LOG_LEVEL=error LOG_HIDE_TIME=1 "
        "SHM_DISABLE=1 CMA_DISABLE=1 START_TIMEOUT=33 shm_peers=0 tcp_peers=1" % tune_log
    )
    for rank in range(2):
        assert "[%d]<stdout>: KNOBS %d %s" % (rank, rank, expected) in result.stdout.splitlines(), result.stdout

    if source == "config-file":
        return
    stalls = run_launcher(
        ["-np", "2", "--stall-check-warning-time-seconds", "7", "--no-stall-check", PY, script], timeout=60
    )
    assert stalls.returncode == 0, stalls.stdout + stalls.stderr
    assert "STALL_CHECK_TIME_SECONDS=0 STALL_SHUTDOWN_TIME_SECONDS=0" in stalls.stdout, stalls.stdout


@pytest.mark.timeout(120)
def test_log_lines_carry_time_level_and_rank_and_take_either_case(tmp_path):
    """Horovod's layout and level names: the bootstrap's lines (Python) and the core's, with and without the
    time; HOROVOD_LOG_LEVEL in capitals is obeyed, an unknown level is named."""
    script = write_script(tmp_path, KNOB_JOB % ["LOG_LEVEL"])
    timed = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: I hvdlite rank (\d)\] ")
    env = {"HOROVOD_LOG_LEVEL": "INFO"}
    result = run_launcher(["-np", "2", PY, script], timeout=90, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line.split(": ", 1)[1] for line in result.stderr.splitlines() if "<stderr>: [" in line]
    bootstrap = [line for line in lines if timed.match(line) and "data-plane listener at" in line]
    core = [line for line in lines if timed.match(line) and "collective algorithms: allreduce_table=" in line]
    assert {timed.match(line).group(1) for line in bootstrap} == {"0", "1"}, lines
    assert core, lines
    hidden = run_launcher(["-np", "2", "--log-level", "Info", "--log-without-timestamp", PY, script], timeout=60)
    assert hidden.returncode == 0, hidden.stdout + hidden.stderr
    assert "[0]<stderr>: [I hvdlite rank 0] data-plane listener at" in hidden.stderr, hidden.stderr
    unknown = run_launcher(["-np", "1", PY, script], timeout=60, env={"HOROVOD_LOG_LEVEL": "loud"})
    assert unknown.returncode == 0, unknown.stdout + unknown.stderr
    assert (
        "W hvdlite rank 0] HVDLITE_LOG_LEVEL (or HOROVOD_LOG_LEVEL) is 'loud'; it takes TRACE, DEBUG, INFO, "
        "WARNING, ERROR or FATAL: logging at WARNING"
    ) in unknown.stderr, unknown.stderr


@pytest.mark.timeout(90)
def test_output_folders_sort_in_rank_order(tmp_path):
    logs = tmp_path / "logs"
    script = write_script(tmp_path, "import os\nprint('rank', os.environ['HVDLITE_RANK'])\n")
    result = run_launcher(["-np", "11", "--output-filename", str(logs), PY, script], timeout=80)
    assert result.returncode == 0, result.stdout + result.stderr
    folders = sorted(os.listdir(logs))
    assert folders == ["rank.%02d" % r for r in range(11)], folders
    assert [(logs / f / "stdout").read_text() for f in folders] == ["rank %d\n" % r for r in range(11)]
