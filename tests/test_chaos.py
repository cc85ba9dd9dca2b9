"""Two minutes of bench/chaos.py under a fixed seed, for both frameworks at once: elastic training (PyTorch, Keras
fit) on 3 network-namespace hosts x 2 slots while every kind of fault arrives every 4-10 s (CI's version of the
chaos hour, docs/faults.md). The job must finish with the weights of a fault-free replay of its committed steps and
leave nothing behind; the test fails, not skips, when the machine cannot create the hosts."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CHAOS_TEST = "test_two_minutes_of_random_faults_keep_the_invariant"
SEEDS = {"torch": 7, "keras": 8}  # different schedules: the two runs' restarts do not all land at once


@pytest.fixture(scope="module")
def chaos_runs(request, tmp_path_factory):
    """The selected frameworks' runs, started together: a run waits on its fault schedule far more than it
    computes (about half a core), so side by side they take the time of one. Each has its own hosts and checks
    only what its own launches left behind."""
    frameworks = sorted(
        {item.callspec.params["framework"] for item in request.session.items if item.originalname == CHAOS_TEST}
    )
    work_dirs_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "hvdlite-chaos-*")))
    runs = {}
    for framework in frameworks:
        out = tmp_path_factory.mktemp("chaos-" + framework)
        with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
            command = [
                sys.executable,
                os.path.join(ROOT, "bench", "chaos.py"),
                "--minutes",
                "2",
                "--seed",
                str(SEEDS[framework]),
            ]
            command += ["--interval", "4", "10", "--framework", framework, "--out-dir", str(out)]
            runs[framework] = (subprocess.Popen(command, stdout=stdout, stderr=stderr), out)
    yield runs
    for process, _ in runs.values():
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # chaos.py then deletes its hosts
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    # Logs worth keeping go to the run's out-dir; the work folder, with the test hosts' keys, goes.
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "hvdlite-chaos-*"))) == work_dirs_before


@pytest.mark.timeout(900)
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_two_minutes_of_random_faults_keep_the_invariant(chaos_runs, framework):
    process, out = chaos_runs[framework]
    process.wait(timeout=840)
    stdout, stderr = (out / "stdout").read_text(), (out / "stderr").read_text()
    print(stdout[-6000:])
    assert process.returncode == 0, stdout[-6000:] + stderr[-4000:]
    summary = json.loads((out / "chaos.json").read_text())
    assert summary["invariant"] == "held" and not summary["failures"], summary["failures"]
    assert summary["faults"] >= 8, summary["faults"]
    injected = {row["kind"]: row["injected"] for row in summary["by_kind"]}
    assert all(count >= 1 for count in injected.values()), injected  # every kind came up
    assert summary["launches"] >= 2  # the whole job was killed at least once and resumed from its checkpoint
    assert summary["steps"] > 0


def test_the_replay_keeps_only_the_steps_behind_the_final_weights(tmp_path, monkeypatch):
    """A round resumes from the last commit: the steps an earlier round ran from there on are superseded, also
    when the job stopped before running them again (a whole job killed just before the chaos ended)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    import chaos_task

    def log(name, attempt, round_, steps, size=2):
        with open(tmp_path / name, "a") as f:
            for step in steps:
                for rank in range(size):
                    event = {"event": "batch", "batches": step, "attempt": attempt, "round": round_, "rank": rank}
                    f.write(json.dumps(dict(event, size=size, indices=[attempt, round_, step, rank])) + "\n")

    log("0-w0.log", 0, 0, range(1, 8))  # a worker lost after step 7 started; the last commit was step 4
    log("0-w0.log", 0, 1, range(5, 11))  # the next round ran steps 5-10; the whole job was killed in step 10
    log("100-w0.log", 100, 0, [9])  # resumed from the checkpoint of step 8 and stopped after one step
    steps = chaos_task.logged_steps(str(tmp_path))
    assert sorted(steps) == list(range(1, 10))
    assert {step: steps[step][:2] for step in steps} == {
        **{step: (0, 0) for step in range(1, 5)},
        **{step: (0, 1) for step in range(5, 9)},
        9: (100, 0),
    }
    assert [indices for _, indices in chaos_task.replay_steps(str(tmp_path))][-1] == [[100, 0, 9, 0], [100, 0, 9, 1]]

    # Killed again; resumed from the checkpoint of step 8, at an epoch's end, after the chaos: it stopped at once.
    with open(tmp_path / "200-w0.log", "w") as f:
        for rank in range(2):
            event = {"event": "resume", "batches": 8, "attempt": 200, "round": 0, "rank": rank, "size": 2}
            f.write(json.dumps(event) + "\n")
    assert sorted(chaos_task.logged_steps(str(tmp_path))) == list(range(1, 9))
