"""Durable elastic state: checkpoint files (hvdlite/common/checkpoint.py), the resume in hvd.elastic.run, and
hvdlite-run's --checkpoint-dir and --max-restarts. The end-to-end tests kill whole jobs (the launcher and every
rank, SIGKILL) and check that running the command again ends with the weights of an uninterrupted run, bit for
bit."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import random
import re
import signal
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from launcher_helpers import LiveJob, run_launcher, wait_until
from multiproc import REPO_ROOT

from hvdlite.common import checkpoint
from hvdlite.common.elastic import State, run_fn
from hvdlite.runner.job import BuiltinJob, run_restarting
from hvdlite.runner.processes import JobOutcome
from hvdlite.runner.settings import Settings

TORCH_JOB = os.path.join(REPO_ROOT, "tests", "jobs", "checkpoint_train.py")
KERAS_JOB = os.path.join(REPO_ROOT, "tests", "jobs", "checkpoint_keras.py")
NUMPY_JOB = os.path.join(REPO_ROOT, "tests", "jobs", "checkpoint_numpy.py")
TORCH_STEPS = 60  # checkpoint_train.py's steps in all
NUMPY_STEPS = 60  # and checkpoint_numpy.py's


# -- files ----------------------------------------------------------------------------------------------------


def _load_quietly(directory):
    """load_latest's result and the warnings it wrote."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        found = checkpoint.load_latest(directory)
    return found, stderr.getvalue()


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory):
    """A directory with the checkpoints of commits 1, 2 and 3, and the bytes of the newest."""
    directory = str(tmp_path_factory.mktemp("three"))
    for sequence in (1, 2, 3):
        checkpoint.write(directory, sequence, {"attributes": {"step": sequence}, "blob": bytes(range(256))}, keep=5)
    newest = checkpoint.path_for(directory, 3)
    with open(newest, "rb") as f:
        return directory, newest, f.read()


def _expect_fallback(directory, newest, damaged, original, why):
    with open(newest, "wb") as f:
        f.write(damaged)
    try:
        (sequence, payload, path), warnings = _load_quietly(directory)
    finally:
        with open(newest, "wb") as f:
            f.write(original)
    assert (sequence, payload["attributes"], path) == (2, {"step": 2}, checkpoint.path_for(directory, 2))
    assert newest in warnings and "unusable" in warnings, warnings
    assert re.search(why, warnings), warnings


def test_a_checkpoint_reads_back_as_written(three_checkpoints):
    directory, newest, data = three_checkpoints
    (sequence, payload, path), warnings = _load_quietly(directory)
    assert (sequence, path, warnings) == (3, newest, "")
    assert payload == {"attributes": {"step": 3}, "blob": bytes(range(256))}
    magic, version, header_sequence, length, digest = checkpoint.HEADER.unpack_from(data)
    assert (magic, version, header_sequence, length) == (b"HVDLCKPT", 1, 3, len(data) - checkpoint.HEADER.size)


def test_a_newest_checkpoint_cut_at_its_boundaries_is_skipped_for_the_previous_one(three_checkpoints):
    directory, newest, original = three_checkpoints
    header = checkpoint.HEADER.size
    for cut in (0, 1, header - 1, header, header + 1, len(original) - 1):
        _expect_fallback(directory, newest, original[:cut], original, "truncated")


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_newest_checkpoint_cut_anywhere_is_skipped_for_the_previous_one(three_checkpoints, data):
    directory, newest, original = three_checkpoints
    cut = data.draw(st.integers(0, len(original) - 1), label="cut")
    _expect_fallback(directory, newest, original[:cut], original, "truncated")


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_corrupted_byte_anywhere_is_detected(three_checkpoints, data):
    directory, newest, original = three_checkpoints
    position = data.draw(st.integers(0, len(original) - 1), label="position")
    damaged = bytearray(original)
    damaged[position] ^= data.draw(st.integers(1, 255), label="xor")
    _expect_fallback(
        directory, newest, bytes(damaged), original, "magic|format version|header says|digest|payload of"
    )


def test_no_usable_checkpoint_means_a_fresh_start(tmp_path):
    assert _load_quietly(str(tmp_path / "missing")) == (None, "")
    checkpoint.write(str(tmp_path), 1, {"attributes": {}}, keep=1)
    with open(checkpoint.path_for(str(tmp_path), 1), "r+b") as f:
        f.truncate(10)
    found, warnings = _load_quietly(str(tmp_path))
    assert found is None and "truncated header" in warnings


def test_keep_deletes_all_but_the_newest(tmp_path):
    directory = str(tmp_path)
    for sequence in range(1, 8):
        checkpoint.write(directory, sequence, {"attributes": {"n": sequence}}, keep=3)
    assert sorted(os.listdir(directory)) == [
        "state-000000000005.ckpt",
        "state-000000000006.ckpt",
        "state-000000000007.ckpt",
    ]


def test_temporary_files_never_count_and_are_removed_before_a_resume(tmp_path):
    directory = str(tmp_path)
    checkpoint.write(directory, 1, {"attributes": {"n": 1}}, keep=3)
    # What a writer killed mid-write leaves: a temporary name, here even with a complete, newer state in it.
    leftover = os.path.join(directory, ".state-abc123.tmp")
    with open(leftover, "wb") as f:
        f.write(checkpoint.encode(9, {"attributes": {"n": 9}}))
    assert checkpoint.list_checkpoints(directory) == [(1, checkpoint.path_for(directory, 1))]
    assert _load_quietly(directory)[0][0] == 1
    for sequence in (2, 3, 4):  # pruning counts final names only
        checkpoint.write(directory, sequence, {"attributes": {"n": sequence}}, keep=1)
    assert sorted(os.listdir(directory)) == [".state-abc123.tmp", "state-000000000004.ckpt"]
    checkpoint.remove_partial_writes(directory)
    assert os.listdir(directory) == ["state-000000000004.ckpt"]


def test_settings_from_arguments_and_from_hvdlite_run(tmp_path):
    resolve = checkpoint.CheckpointSettings.resolve
    assert resolve(environ={}) is None
    assert resolve(str(tmp_path), environ={}) == checkpoint.CheckpointSettings(str(tmp_path), 1, 3)
    env = {"HVDLITE_CHECKPOINT_DIR": "/ckpt", "HVDLITE_CHECKPOINT_EVERY": "5", "HVDLITE_CHECKPOINT_KEEP": "2"}
    assert resolve(environ=env) == checkpoint.CheckpointSettings("/ckpt", 5, 2)
    assert resolve("/mine", keep=7, environ=env) == checkpoint.CheckpointSettings("/mine", 5, 7)  # arguments win
    with pytest.raises(ValueError, match="HVDLITE_CHECKPOINT_EVERY='x' is not a whole number"):
        resolve(environ=dict(env, HVDLITE_CHECKPOINT_EVERY="x"))
    with pytest.raises(ValueError, match="checkpoint_keep must be at least 1"):
        resolve("/d", keep=0, environ={})


# -- State and hvd.elastic.run ---------------------------------------------------------------------------------


def _state(**attributes):
    """A framework-free State of one rank: the broadcast hands its object back."""
    return State(lambda value, root: value, lambda: 0, **attributes)


def _train_steps(state, steps):
    for _ in range(steps):
        state.step += 1
        state.history = state.history + [state.step]
        state.commit()


def test_run_resumes_from_the_newest_checkpoint_in_each_of_its_forms(tmp_path, monkeypatch):
    directory = str(tmp_path / "ckpt")
    reset = lambda: None  # noqa: E731 - never called: nothing fails

    # hvd.elastic.run(func, checkpoint_dir=...)
    first = _state(step=0, history=[])
    run_fn(_train_steps, reset, checkpoint_dir=directory, checkpoint_keep=2)(first, 3)
    assert [s for s, _ in checkpoint.list_checkpoints(directory)] == [3, 2]

    # @hvd.elastic.run(checkpoint_dir=..., checkpoint_every=2): resumes, goes on numbering the commits
    @run_fn(None, reset, checkpoint_dir=directory, checkpoint_every=2, checkpoint_keep=10)
    def train(state):
        assert (state.step, state.history) == (3, [1, 2, 3])
        _train_steps(state, 3)

    train(_state(step=0, history=[]))
    assert [s for s, _ in checkpoint.list_checkpoints(directory)] == [6, 4, 3, 2]

    # plain @hvd.elastic.run, the directory from hvdlite-run's variable
    monkeypatch.setenv("HVDLITE_CHECKPOINT_DIR", directory)
    second = _state(step=0, history=[])
    run_fn(lambda state: None, reset)(second)
    assert (second.step, second.history, second._commits) == (6, [1, 2, 3, 4, 5, 6], 6)

    # without a directory anywhere, nothing is read or written
    monkeypatch.delenv("HVDLITE_CHECKPOINT_DIR")
    fresh = _state(step=0, history=[])
    run_fn(_train_steps, reset)(fresh, 1)
    assert fresh.step == 1 and len(checkpoint.list_checkpoints(directory)) == 4


def test_only_rank_0_reads_and_writes_checkpoints(tmp_path):
    directory = str(tmp_path)
    checkpoint.write(directory, 5, {"attributes": {"step": 5}}, keep=3)
    other = State(lambda value, root: value, lambda: 1, step=0)
    run_fn(lambda state: state.commit(), lambda: None, checkpoint_dir=directory)(other)
    assert other.step == 0 and [s for s, _ in checkpoint.list_checkpoints(directory)] == [5]


# -- the launcher ---------------------------------------------------------------------------------------------


def _parse(*flags):
    from hvdlite.runner.arguments import build_parser, settings_from_args

    return settings_from_args(build_parser().parse_args(["-np", "2", *flags, "python", "t.py"]))


def test_checkpoint_and_restart_flags(tmp_path, capsys):
    settings = _parse(
        "--checkpoint-dir", "ckpt", "--checkpoint-every", "4", "--checkpoint-keep", "2", "--max-restarts", "3"
    )
    assert settings.knobs == {
        "HVDLITE_CHECKPOINT_DIR": os.path.abspath("ckpt"),
        "HVDLITE_CHECKPOINT_EVERY": "4",
        "HVDLITE_CHECKPOINT_KEEP": "2",
    }
    assert settings.max_restarts == 3
    assert _parse().max_restarts == 0 and _parse().knobs == {}
    for flags, message in (
        (["--checkpoint-every", "2"], "need --checkpoint-dir"),
        (["--checkpoint-dir", "d", "--checkpoint-keep", "0"], "must be at least 1"),
        (["--max-restarts", "-1"], "must be at least 0"),
        (["--mpi", "--max-restarts", "1"], "needs the built-in launcher"),
    ):
        with pytest.raises(SystemExit):
            from hvdlite.runner.launch import main

            main(["-np", "2", *flags, "python", "t.py"])
        assert message in capsys.readouterr().err, flags


def test_which_failures_are_started_again(capsys):
    def attempts(*outcomes):
        """run_restarting over attempts that end as given; returns (final outcome, restart counts seen)."""
        seen, results = [], list(outcomes)

        def attempt(settings):
            restart = settings.knobs["HVDLITE_RESTART_COUNT"]
            assert settings.knobs["HVDLITE_X"] == "1"
            expected_output = "logs" if restart == "0" else os.path.join("logs", "restart." + restart)
            assert settings.output_filename == expected_output
            seen.append(restart)
            return results.pop(0)

        settings = Settings(np=2, max_restarts=2, knobs={"HVDLITE_X": "1"}, output_filename="logs")
        return run_restarting(settings, attempt), seen

    crashed = (JobOutcome(3, failed_rank=1), None)
    assert attempts(crashed, (JobOutcome(0), None)) == (JobOutcome(0), ["0", "1"])
    assert attempts(crashed, crashed, crashed) == (JobOutcome(3, 1), ["0", "1", "2"])
    assert "restart 2 of 2" in capsys.readouterr().err
    assert attempts((JobOutcome(128 + signal.SIGINT), None)) == (JobOutcome(130), ["0"])  # Ctrl-C
    assert "stopped by SIGINT" in capsys.readouterr().err
    assert attempts((JobOutcome(128 + signal.SIGTERM), None))[1] == ["0"]
    assert attempts((JobOutcome(124), None))[1] == ["0"]  # --timeout
    assert "--timeout" in capsys.readouterr().err
    assert attempts((JobOutcome(128 + signal.SIGKILL, failed_rank=0), None), (JobOutcome(0), None))[1] == ["0", "1"]
    assert attempts((JobOutcome(1, failed_rank=0), "its ranks did not all start within --start-timeout"))[1] == ["0"]
    assert "--start-timeout" in capsys.readouterr().err
    once = run_restarting(Settings(np=2), lambda settings: crashed)  # --max-restarts 0: as before, silently
    assert once == JobOutcome(3, 1) and capsys.readouterr().err == ""


def test_a_start_timeout_is_told_from_a_crash():
    with BuiltinJob(Settings(np=3), ["true"]) as job:
        assert not job.missed_start(JobOutcome(1, failed_rank=0))  # nobody met: it failed before init
        job.client().put(f"init.{job.job_id}.0", "0", b"address")
        job.client().put(f"init.{job.job_id}.0", "2", b"address")
        assert job.missed_start(JobOutcome(1, failed_rank=0))  # rank 0 waited for rank 1 in vain
        assert not job.missed_start(JobOutcome(1, failed_rank=1))  # rank 1 never got there: a crash
        assert not job.missed_start(JobOutcome(124))


# -- whole jobs -----------------------------------------------------------------------------------------------


def _descendants(pid):
    """Every process under ``pid``, from the parent ids in /proc (the ranks are in sessions of their own)."""
    children = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    children[int(f.read().rsplit(b")", 1)[1].split()[1])].append(int(entry))
            except OSError:
                continue
    found, todo = [], [pid]
    while todo:
        kids = children[todo.pop()]
        found += kids
        todo += kids
    return found


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _kill_whole_job(job: LiveJob) -> None:
    """SIGKILL to the launcher and every process under it (each rank has a session of its own), as a machine
    that is lost: no handler runs, nothing is cleaned up."""
    pids = [job.proc.pid] + _descendants(job.proc.pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.proc.wait(timeout=10)
    assert wait_until(lambda: all(_gone(pid) for pid in pids), 10), pids


def _starts(output: str):
    return [int(n) for n in re.findall(r"^\[0\]<stdout>: START (\d+)$", output, re.M)]


def _weights(out_dir):
    with open(os.path.join(out_dir, "weights.json")) as f:
        return json.load(f)


def _job_command(job, tmp, *extra):
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    return ["-np", "2", "--checkpoint-dir", str(tmp / "ckpt"), *extra, sys.executable, job, str(out)], str(out)


def _torch_command(tmp, *extra):
    return _job_command(TORCH_JOB, tmp, *extra)


@pytest.fixture(scope="module")
def numpy_reference(tmp_path_factory):
    """The final weights of checkpoint_numpy.py run once without interruption."""
    args, out = _job_command(NUMPY_JOB, tmp_path_factory.mktemp("numpy-reference"))
    result = run_launcher(args, timeout=120)
    assert result.returncode == 0, result.stderr
    assert _starts(result.stdout) == [0]
    return _weights(out)


@pytest.fixture(scope="module")
def torch_reference(tmp_path_factory):
    """The final weights of checkpoint_train.py run once without interruption."""
    args, out = _torch_command(tmp_path_factory.mktemp("reference"))
    result = run_launcher(args, timeout=120)
    assert result.returncode == 0, result.stderr
    assert _starts(result.stdout) == [0]
    return _weights(out)


def _stopped_process(job: LiveJob, timeout: float = 60) -> bool:
    """Waits until a process of the job is stopped (rank 0 at its PAUSE_AT), and then until rank 0's START line,
    printed before it stopped, has come through the launcher: a launcher killed before it forwarded the line loses
    it, as a lost machine loses what it had not sent. False when the job ended first."""

    def stopped_or_ended():
        if job.proc.poll() is not None:
            return True
        for pid in _descendants(job.proc.pid):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"T":
                    return True
        return False

    assert wait_until(stopped_or_ended, timeout, interval=0.02), job.output()
    if job.proc.poll() is not None:
        return False
    assert wait_until(lambda: _starts("".join(job.stdout)), 30, interval=0.02), job.output()
    return True


def test_a_job_killed_20_times_ends_with_the_weights_of_an_uninterrupted_run(numpy_reference, tmp_path):
    """The framework-free job, which starts in a fraction of a second; the torch job is killed and resumed under
    the elastic driver and restarted by --max-restarts below, and the Keras one further down."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    args, out = _job_command(NUMPY_JOB, tmp_path)
    starts = []
    for step in sorted(rng.sample(range(1, NUMPY_STEPS), 20)):
        where = rng.choice(["before", "after"])  # the last commit is step - 1 or step
        job = LiveJob(args, env={"PAUSE_AT": f"{step} {where}"})
        try:
            paused = _stopped_process(job)
            _kill_whole_job(job)
        finally:
            job.close()
        job.finish()
        starts += _starts("".join(job.stdout))
        assert paused, f"seed {seed}: the job ended before step {step}\n{job.output()}"
    result = run_launcher(args, timeout=120)
    assert result.returncode == 0, result.stderr
    starts += _starts(result.stdout)
    assert _weights(out) == numpy_reference, f"seed {seed}, resumed at steps {starts}"
    assert len(starts) == 21 and starts[-1] > 0 and starts == sorted(starts), starts  # each from a later commit
    names = os.listdir(tmp_path / "ckpt")
    assert len(names) == 3 and all(name.endswith(".ckpt") for name in names), names  # keep 3, no leftovers


def test_under_the_elastic_driver_a_lost_job_resumes_from_its_checkpoint(torch_reference, tmp_path):
    """A job killed whole resumes from its checkpoint, also where the rank 0 that reads it and hands it on in the
    first sync is lost in between: the next round's rank 0 (a survivor that never synced) loads it in its place,
    where the job would otherwise start again from step 0."""
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:2\n")
    discover.chmod(0o755)
    args, out = _torch_command(
        tmp_path, "--host-discovery-script", str(discover), "--blacklist-cooldown-range", "1", "2"
    )
    step = random.randint(1, TORCH_STEPS - 1)
    job = LiveJob(args, env={"PAUSE_AT": f"{step} after"})
    try:
        assert _stopped_process(job), job.output()
        _kill_whole_job(job)
    finally:
        job.close()
    job.finish()
    assert _starts("".join(job.stdout)) == [0]
    result = run_launcher(args, timeout=120, env={"LOSE_AT_FIRST_SYNC": "w0"})
    assert result.returncode == 0, result.stderr
    assert "worker w0 (rank 0 on localhost) exited with code 9" in result.stderr, result.stderr
    # Rank 0 prints START; its worker (the output's prefix) is w1 here.
    assert re.findall(r"^\[\d+\]<stdout>: START (\d+)$", result.stdout, re.M) == [str(step)], result.stdout
    assert _weights(out) == torch_reference


def test_max_restarts_starts_a_failed_job_again_from_its_checkpoint(torch_reference, tmp_path):
    args, out = _torch_command(tmp_path, "--max-restarts", "1")
    result = run_launcher(args + ["25"], timeout=120)  # rank 1 of the first attempt exits 3 at step 25
    assert result.returncode == 0, result.stderr
    assert "exited with code 3" in result.stderr
    assert "the job failed with exit code 3; starting it again (restart 1 of 1)" in result.stderr
    starts = _starts(result.stdout)
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 24, starts
    assert _weights(out) == torch_reference


def test_without_max_restarts_a_failed_job_stays_failed(tmp_path):
    args, out = _torch_command(tmp_path)
    result = run_launcher(args + ["25"], timeout=120)
    assert result.returncode == 3, result.stderr
    assert "starting it again" not in result.stderr and _starts(result.stdout) == [0]
    assert not os.path.exists(os.path.join(out, "weights.json"))


def test_keras_fit_killed_and_resumed_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    def command(name):
        out = tmp_path / name
        out.mkdir()
        return ["-np", "2", sys.executable, KERAS_JOB, str(out), str(tmp_path / f"{name}-ckpt")], str(out)

    reference_args, reference_out = command("reference")
    result = run_launcher(reference_args, timeout=180)
    assert result.returncode == 0, result.stderr
    args, out = command("interrupted")
    epoch, batch = random.randint(1, 4), random.randint(0, 3)  # 6 epochs of 4 batches
    job = LiveJob(args, env={"PAUSE_AT": f"{epoch} {batch}"})
    try:
        assert _stopped_process(job, timeout=120), job.output()
        _kill_whole_job(job)
    finally:
        job.close()
    job.finish()
    result = run_launcher(args, timeout=180)
    assert result.returncode == 0, result.stderr
    assert _starts(result.stdout) == [epoch], result.stdout  # from the commit at the end of the epoch before
    assert _weights(out) == _weights(reference_out)
