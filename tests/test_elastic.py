"""Elastic training under hvdlite-run --host-discovery-script: a worker killed mid-epoch, training going on
with the others from the last commit, a worker added back, and a job that loses more than --min-np allows.

The workers run tests/jobs/elastic_train.py (a small torch model, ElasticSampler, TorchState, a commit after
every batch) and log what they did; the checks read those logs."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from launcher_helpers import hvdlite_run
from multiproc import job_env

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(TESTS_DIR, "jobs", "elastic_train.py")
SAMPLES = 480


def events(out_dir) -> dict:
    """Worker id -> its logged events."""
    logs = {}
    for name in os.listdir(out_dir):
        if name.endswith(".log"):
            with open(os.path.join(out_dir, name)) as f:
                logs[name[:-4]] = [json.loads(line) for line in f if line.strip()]
    return logs


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_first_commits(tmp_path, batches=5):
    """Until worker w0 has committed `batches` batches: the job is training."""
    wait_for(
        lambda: any(e["event"] == "batch" and e["batches"] >= batches for e in events(tmp_path).get("w0", [])),
        120,
        f"w0 to commit {batches} batches",
    )


def start_job(
    tmp_path, np, min_np, max_np, epochs, extra=(), discover_body="echo localhost:4", job_args=(), env=None
):
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\n{discover_body}\n")
    discover.chmod(0o755)
    cmd = [
        hvdlite_run(),
        "-np",
        str(np),
        "--min-np",
        str(min_np),
        "--max-np",
        str(max_np),
        "--host-discovery-script",
        str(discover),
        *extra,
        sys.executable,
        JOB,
        str(tmp_path),
        str(epochs),
        *job_args,
    ]
    return subprocess.Popen(
        cmd, env=job_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def start_job_on_slots(tmp_path, slots_line: str, np, max_np, epochs, extra=(), env=None):
    """start_job on localhost with --min-np 2, its discovery script printing the file it returns (one host:slots
    line, first slots_line): the test changes the slots by rewriting it."""
    slots = tmp_path / "slots"
    slots.write_text(slots_line + "\n")
    proc = start_job(
        tmp_path, np=np, min_np=2, max_np=max_np, epochs=epochs, discover_body=f"cat {slots}", extra=extra, env=env
    )
    return slots, proc


def kill_worker_after(tmp_path, worker: str, batches: int) -> None:
    def reached():
        log = events(tmp_path).get(worker, [])
        return any(e["event"] == "batch" and e["batches"] >= batches for e in log) and log

    log = wait_for(reached, 90, f"{worker} to commit {batches} batches")
    os.kill(log[0]["pid"], signal.SIGKILL)


def finish(proc, timeout=150) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the elastic job did not finish:\n{out[-5000:]}")
    return out


def check_epochs_cover_every_sample(logs, epochs):
    """The batches that count, of each epoch, cover every sample; repeats only from the padding that evens out the
    ranks' shares (at most size - 1 per share, one share per round).

    A step counts from the last round that ran it, as in the replay (tests/jobs/elastic_train.py): a lost worker
    may have sent its last contribution to some peers only, so its final step completes (and is logged and
    committed) on those and fails on the others, rank 0 among them; the next round resumes from rank 0's commit
    and runs that step again. Its first run's samples are superseded, not repeated."""
    steps = {}  # step -> (round, epoch, [indices of every rank])
    for log in logs.values():
        for e in log:
            if e["event"] != "batch":
                continue
            round_, epoch, indices = steps.get(e["batches"], (-1, None, []))
            if e["round"] > round_:
                round_, epoch, indices = e["round"], e["epoch"], []
            if e["round"] == round_:
                indices = indices + e["indices"]
            steps[e["batches"]] = (round_, epoch, indices)
    by_epoch = collections.defaultdict(list)
    for _, epoch, indices in steps.values():
        by_epoch[epoch].extend(indices)
    assert sorted(by_epoch) == list(range(epochs)), sorted(by_epoch)
    for epoch, seen in by_epoch.items():
        assert set(seen) == set(range(SAMPLES)), f"epoch {epoch} skipped {set(range(SAMPLES)) - set(seen)}"
        assert len(seen) - SAMPLES <= 2 * 3, f"epoch {epoch}: {len(seen) - SAMPLES} samples repeated"


# Long enough that the worker added back (blacklist cooldown, discovery, start-up: 6-8 s after the loss) joins
# before the others finish, also on a loaded machine.
EPOCHS_AFTER_A_LOSS = 14


@pytest.mark.timeout(240)
@pytest.mark.parametrize("optimizer", ["sgd", "sharded-momentum"])
def test_worker_lost_mid_epoch_then_added_back(tmp_path, optimizer):
    """sharded-momentum: the optimizer state is sharded over the ranks (shard_optimizer_state=True); every
    re-formed job partitions it anew from the committed state."""
    proc = start_job(
        tmp_path,
        np=4,
        min_np=3,
        max_np=4,
        epochs=EPOCHS_AFTER_A_LOSS,
        extra=["--blacklist-cooldown-range", "2", "3"],
        job_args=[optimizer],
    )
    kill_worker_after(tmp_path, "w2", batches=10)
    out = finish(proc)
    assert proc.returncode == 0, out[-5000:]
    assert (
        "worker w2 (rank 2 on localhost) exited with code 137; the job re-forms with the 3 remaining worker(s); "
        "no new worker starts on localhost for the next " in out
    ), out[-5000:]
    assert "s (blacklisted; --blacklist-cooldown-range 2 3); its 3 other worker(s) there go on" in out, out[-5000:]
    assert "elastic round 1: 3 worker(s)" in out and "elastic round 2: 4 worker(s)" in out, out[-5000:]
    logs = events(tmp_path)
    assert "w4" in logs, "no worker was added back"
    done = {w: next(e for e in log if e["event"] == "done") for w, log in logs.items() if w != "w2"}
    assert set(done) == {"w0", "w1", "w3", "w4"}, set(done)
    for worker in ("w0", "w1", "w3"):
        assert done[worker]["sizes"] == [4, 3, 4], (worker, done[worker])
    assert done["w4"]["sizes"] == [4]
    weights = {tuple(d["weights"]) for d in done.values()}
    assert len(weights) == 1, "the workers finished with different models"
    assert len({d["batches"] for d in done.values()}) == 1  # the new worker took over the step count too
    check_epochs_cover_every_sample(logs, epochs=EPOCHS_AFTER_A_LOSS)
    # The reference: one process replays the logged schedule (same samples per step, same commits).
    replayed = subprocess.run(
        [sys.executable, JOB, "--replay", str(tmp_path), optimizer],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    reference = json.loads(replayed.stdout.strip().splitlines()[-1])
    assert reference["steps"] == done["w0"]["batches"], (reference["steps"], done["w0"]["batches"])
    final = done["w0"]["weights"]
    # float32 sums in another order (ring allreduce vs this loop): equal to ~1e-6; a step applied twice, lost,
    # or trained on other samples moves them by ~1e-2 (lr 0.01).
    assert all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(final, reference["weights"])), (
        final,
        reference["weights"],
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wait_flag", ["--start-timeout", "--elastic-timeout"])
def test_losing_more_workers_than_min_np_allows_ends_the_job(tmp_path, wait_flag):
    proc = start_job(tmp_path, np=3, min_np=3, max_np=3, epochs=50, extra=[wait_flag, "3"])
    if wait_flag == "--elastic-timeout":  # horovodrun's flag also reaches the workers' wait for a round
        pid = wait_for(lambda: events(tmp_path).get("w0"), 60, "worker w0 to start")[0]["pid"]
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
        assert b"HVDLITE_ELASTIC_TIMEOUT=3.0" in environ, environ
    kill_worker_after(tmp_path, "w1", batches=3)
    start = time.monotonic()
    out = finish(proc, timeout=60)
    assert proc.returncode == 137, out[-4000:]  # the lost worker's code, as for a plain job
    assert (
        f"only 2 worker(s) can continue, fewer than --min-np 3, and no more came within 3 s ({wait_flag})" in out
    ), out[-4000:]
    assert time.monotonic() - start < 30


@pytest.mark.timeout(120)
def test_reset_limit_stops_the_job_instead_of_re_forming_it(tmp_path):
    proc = start_job(tmp_path, np=3, min_np=2, max_np=3, epochs=50, extra=["--reset-limit", "0"])
    kill_worker_after(tmp_path, "w1", batches=3)
    out = finish(proc, timeout=60)
    assert proc.returncode == 137, out[-4000:]
    assert "the job has re-formed 0 time(s) and --reset-limit is 0; stopping it" in out, out[-4000:]
    assert "elastic round 1" not in out, out[-4000:]


def worker_pid(worker: str, script: str) -> int:
    """The pid of the process running ``script`` as elastic worker ``worker`` (from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if script.encode() not in f.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"HVDLITE_WORKER_ID={worker}".encode() in f.read().split(b"\0"):
                    return int(entry)
        except OSError:
            continue
    raise AssertionError(f"no process of worker {worker}")


@pytest.mark.timeout(300)
def test_elastic_example_survives_the_loss_of_a_worker(tmp_path):
    """examples/pytorch_elastic.py as its docstring runs it, on generated MNIST files; one worker is killed after
    the first epoch and the other finishes alone."""
    root = os.path.dirname(TESTS_DIR)
    data = tmp_path / "mnist"
    subprocess.run(
        [
            sys.executable,
            os.path.join(root, "examples", "make_mnist_idx.py"),
            "--out",
            str(data),
            "--train",
            "1200",
            "--test",
            "400",
        ],
        check=True,
    )
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:2\n")
    discover.chmod(0o755)
    example = os.path.join(root, "examples", "pytorch_elastic.py")
    proc = subprocess.Popen(
        [
            hvdlite_run(),
            "-np",
            "2",
            "--min-np",
            "1",
            "--max-np",
            "2",
            "--host-discovery-script",
            str(discover),
            sys.executable,
            example,
            "--data-dir",
            str(data),
            "--epochs",
            "3",
        ],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "epoch 1 done on 2 worker(s)" in line:
                os.kill(worker_pid("w1", example), signal.SIGKILL)
                break
        out = "".join(lines) + finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-5000:]
    assert "re-formed: 1 worker(s)" in out and "epoch 3 done on 1 worker(s)" in out, out[-5000:]
    accuracy = float(out.split("test accuracy ")[1].split("%")[0])
    assert accuracy > 50.0, out[-3000:]  # ten classes: chance is 10%


@pytest.mark.timeout(300)
def test_keras_fit_survives_the_loss_of_a_worker(tmp_path):
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:3\n")
    discover.chmod(0o755)
    job = os.path.join(TESTS_DIR, "jobs", "elastic_keras.py")
    proc = subprocess.Popen(
        [
            hvdlite_run(),
            "-np",
            "3",
            "--min-np",
            "2",
            "--max-np",
            "3",
            "--host-discovery-script",
            str(discover),
            sys.executable,
            job,
            str(tmp_path),
            "6",
        ],
        env=job_env({"TF_CPP_MIN_LOG_LEVEL": "2"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def second_epoch():
        log = events(tmp_path).get("w1", [])
        return log if any(e["event"] == "epoch" and e["epoch"] >= 2 for e in log) else None

    try:
        log = wait_for(second_epoch, 180, "w1 to finish two epochs")
        os.kill(log[0]["pid"], signal.SIGKILL)
        out = finish(proc, timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-5000:]
    logs = events(tmp_path)
    done = {w: next(e for e in log if e["event"] == "done") for w, log in logs.items() if w != "w1"}
    assert set(done) == {"w0", "w2"}, out[-3000:]
    for worker, result in done.items():
        assert result["sizes"] == [3, 2] and result["epoch"] == 6, (worker, result)
    assert done["w0"]["weights"] == done["w2"]["weights"]


# -- a host's slot count going down and up (issue 29) ---------------------------------------------------------


class _FakeProcess:
    """Stands in for a RankProcess: the driver's logic without processes."""

    def __init__(self):
        self.code = None
        self.signals = []

    def exited(self):
        return self.code

    def signal_group(self, signum):
        self.signals.append(signum)


def _fake_driver(monkeypatch, max_np=3):
    from hvdlite.common.rendezvous import RendezvousServer
    from hvdlite.runner import elastic as driver_module
    from hvdlite.runner.settings import Settings

    driver = driver_module.ElasticDriver(
        Settings(np=3), driver_module.ElasticSettings(min_np=2, max_np=max_np, discovery_script="true"), ["true"]
    )
    driver.server = RendezvousServer(b"secret").start()
    monkeypatch.setattr(driver_module, "start_rank", lambda *args, **kwargs: _FakeProcess())
    return driver


def test_slot_count_changes_mark_unmark_and_reuse_slots(monkeypatch):
    """The driver's bookkeeping, without processes: marks, lifted marks, the hosts_updated flag, slot reuse."""
    driver = _fake_driver(monkeypatch)
    try:
        _slot_count_changes(driver)
    finally:
        driver.server.stop()


def _slot_count_changes(driver):
    from hvdlite.runner.hosts import HostSlots

    def flag():
        return driver.server.peek(driver.scope, "hosts_updated")

    def state():  # worker -> (slot, marked to leave, stopped by the driver)
        return {w.worker_id: (w.slot, w.leaving, w.stopped is not None) for w in driver.live()}

    def exit_(worker_id, code=143):
        worker = next(w for w in driver.workers if w.worker_id == worker_id)
        worker.process.code = worker.exit_code = code

    driver._discovered([HostSlots("localhost", 3)])
    assert state() == {"w0": (0, False, False), "w1": (1, False, False), "w2": (2, False, False)}
    assert flag() is None  # round 0 is not formed yet
    driver._form_round(driver.active())
    # 3 -> 2: the highest rank is marked and the members are told to re-form at their next commit.
    driver._discovered([HostSlots("localhost", 2)])
    assert state()["w2"] == (2, True, False) and flag() == b"0"
    # 2 -> 3 before that commit: the mark is lifted, the flag cleared (no needless re-form), nobody started.
    driver._discovered([HostSlots("localhost", 3)])
    assert state() == {"w0": (0, False, False), "w1": (1, False, False), "w2": (2, False, False)}
    assert flag() == b"-1"
    # 3 -> 2 again, and this time the round re-forms: w2 is stopped (SIGTERM), not placed.
    driver._discovered([HostSlots("localhost", 2)])
    assert flag() == b"0"
    driver._drop_leavers(driver.active())
    driver._form_round(driver.active())
    assert driver.members == {"w0", "w1"} and signal.SIGTERM in driver.workers[2].process.signals
    # 2 -> 3 while w2 is still exiting: its slot is not used yet ...
    driver._discovered([HostSlots("localhost", 3)])
    assert set(state()) == {"w0", "w1", "w2"} and flag() == b"0"
    # ... and at the next discovery after its exit, a new worker starts on slot 2; the members are told once it
    # waits to join the next round, not while it starts up.
    exit_("w2")
    driver._discovered([HostSlots("localhost", 3)])
    assert state() == {"w0": (0, False, False), "w1": (1, False, False), "w3": (2, False, False)}
    driver._newcomers_waiting()
    assert flag() == b"0"
    driver.server.put(driver.scope, f"ready.{driver.round + 1}.w3", b"1")
    driver._newcomers_waiting()
    assert flag() == b"1"
    # A worker that is in no round yet is stopped at once when its slot goes (it is in no mesh).
    driver._discovered([HostSlots("localhost", 2)])
    assert state()["w3"] == (2, False, True) and not any(w.leaving for w in driver.active())
    exit_("w3")
    # Slots are counted, not numbered: workers on slots 0 and 2 fill a 2-slot host; a third slot takes slot 1.
    exit_("w1", code=1)
    driver._discovered([HostSlots("localhost", 3)])
    assert state() == {"w0": (0, False, False), "w4": (1, False, False), "w5": (2, False, False)}
    exit_("w4", code=1)
    driver._discovered([HostSlots("localhost", 2)])
    assert state() == {"w0": (0, False, False), "w5": (2, False, False)}


@pytest.mark.timeout(180)
def test_slot_count_down_then_up_removes_then_adds_a_worker(tmp_path):
    """Discovery prints localhost:3, then localhost:2, then localhost:3: the rounds have 3, 2 and 3 workers; the
    removed worker leaves at a commit (no failure, no blacklisting) and the result equals the replayed schedule."""
    interval = 0.5
    slots, proc = start_job_on_slots(
        tmp_path, "localhost:3", np=3, max_np=3, epochs=6, extra=["--discovery-interval", str(interval)]
    )
    try:

        def round_of_size(size, after=0):
            return any(
                e["event"] == "round" and e["size"] == size and e["time"] > after
                for e in events(tmp_path).get("w0", [])
            )

        def batches_in_round_of(size):
            return any(e["event"] == "batch" and e["size"] == size for e in events(tmp_path).get("w0", []))

        wait_for_first_commits(tmp_path)
        shrink = time.time()
        slots.write_text("localhost:2\n")
        wait_for(lambda: round_of_size(2), 60, "a round of 2 workers")
        shrunk_after = max(e["time"] for e in events(tmp_path)["w0"] if e["event"] == "round") - shrink
        wait_for(lambda: batches_in_round_of(2), 60, "a batch in the round of 2")
        grow = time.monotonic()
        slots.write_text("localhost:3\n")
        wait_for(lambda: _has_worker("w3"), 30, "worker w3 to start")
        started_after = time.monotonic() - grow
        out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-5000:]
    # Within one discovery interval plus one commit (a batch is ~0.05 s; the rest is a loaded 2-core machine).
    assert shrunk_after < interval + 5, (shrunk_after, out[-3000:])
    assert started_after < interval + 5, (started_after, out[-3000:])
    assert "host localhost now has 2 slot(s); worker w2 (rank 2) leaves the job at the next commit" in out, out[
        -5000:
    ]
    assert "stopping worker w2 (rank 2 on localhost): its slot was removed; it is not a failure" in out, out[-5000:]
    assert "exited with code" not in out and "blacklisted" not in out, out[-5000:]
    assert "elastic round 0: 3 worker(s)" in out and "elastic round 1: 2 worker(s)" in out, out[-5000:]
    assert "elastic round 2: 3 worker(s)" in out and "elastic round 3" not in out, out[-5000:]
    logs = events(tmp_path)
    assert set(logs) == {"w0", "w1", "w2", "w3"}, set(logs)
    assert not any(e["event"] == "done" for e in logs["w2"])
    done = {w: next(e for e in log if e["event"] == "done") for w, log in logs.items() if w != "w2"}
    for worker in ("w0", "w1"):
        assert done[worker]["sizes"] == [3, 2, 3], (worker, done[worker])
    assert done["w3"]["sizes"] == [3]
    assert len({tuple(d["weights"]) for d in done.values()}) == 1, "the workers finished with different models"
    assert len({d["batches"] for d in done.values()}) == 1
    check_epochs_cover_every_sample(logs, epochs=6)
    replayed = subprocess.run(
        [sys.executable, JOB, "--replay", str(tmp_path)], env=job_env(), capture_output=True, text=True, timeout=120
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    reference = json.loads(replayed.stdout.strip().splitlines()[-1])
    assert reference["steps"] == done["w0"]["batches"], (reference["steps"], done["w0"]["batches"])
    assert all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(done["w0"]["weights"], reference["weights"])), (
        done["w0"]["weights"],
        reference["weights"],
    )


@pytest.mark.timeout(180)
def test_each_round_shares_the_hosts_cpus_among_its_ranks_there(tmp_path, monkeypatch):
    """Without OMP_NUM_THREADS, a worker alone on the host keeps torch's whole pool; when a second joins, both
    take their share of the CPUs; when it leaves, the first gets its whole pool back."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one CPU: every share is the whole pool")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    slots = tmp_path / "slots"
    slots.write_text("localhost:1\n")
    interval = 0.5
    proc = start_job(
        tmp_path,
        np=1,
        min_np=1,
        max_np=2,
        epochs=100,  # stopped once w0 is alone again
        discover_body=f"cat {slots}",
        extra=["--discovery-interval", str(interval)],
    )
    try:

        def rounds_of(worker):
            return [e for e in events(tmp_path).get(worker, []) if e["event"] == "round"]

        def trained_in_round_of(size):
            return any(e["event"] == "batch" and e["size"] == size for e in events(tmp_path).get("w0", []))

        wait_for_first_commits(tmp_path)
        slots.write_text("localhost:2\n")
        wait_for(lambda: trained_in_round_of(2), 90, "a batch in the round of 2")
        slots.write_text("localhost:1\n")
        wait_for(
            lambda: [r["size"] for r in rounds_of("w0")][-1:] == [1] and len(rounds_of("w0")) >= 3,
            90,
            "w0 alone again",
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    logs = events(tmp_path)
    pool = next(e["threads"] for e in logs["w0"] if e["event"] == "start")
    if pool * 2 <= cpus:
        pytest.skip(f"torch's pool ({pool} threads) fits {cpus} CPUs twice: nothing to share")
    share = max(1, cpus // 2)
    assert [(r["size"], r["threads"]) for r in rounds_of("w0")] == [(1, pool), (2, share), (1, pool)], out[-3000:]
    assert [(r["size"], r["threads"]) for r in rounds_of("w1")] == [(2, share)], out[-3000:]


@pytest.mark.timeout(180)
def test_the_job_trains_on_while_an_added_worker_starts(tmp_path):
    """Discovery adds a slot; the new worker takes 8 s to start (as importing a big framework can). The running
    workers train on meanwhile instead of waiting for it at their next commit, and it joins the round after."""
    slots, proc = start_job_on_slots(
        tmp_path,
        "localhost:2",
        np=2,
        max_np=3,
        epochs=10,
        extra=["--discovery-interval", "0.5"],
        env={"ELASTIC_SLOW_START": "w2=8"},
    )
    try:
        wait_for_first_commits(tmp_path)
        slots.write_text("localhost:3\n")
        out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-5000:]
    logs = events(tmp_path)
    begun = next(e["time"] for e in logs["w2"] if e["event"] == "start")
    started = next(e["time"] for e in logs["w2"] if e["event"] == "started")
    # The members' steps while w2 was starting (past the first second, in which they may be finishing a step).
    meanwhile = [e for e in logs["w0"] if e["event"] == "batch" and begun + 1 < e["time"] < started]
    assert len(meanwhile) >= 30, (len(meanwhile), out[-3000:])
    joined = [e["time"] for e in logs["w0"] if e["event"] == "round" and e["size"] == 3]
    assert joined and joined[0] > started, (joined, started)
    assert "elastic round 1: 3 worker(s)" in out and "elastic round 2" not in out, out[-5000:]
    done = {w: next(e for e in log if e["event"] == "done") for w, log in logs.items()}
    assert done["w2"]["sizes"] == [3] and done["w0"]["sizes"] == [2, 3], done
    assert len({tuple(d["weights"]) for d in done.values()}) == 1, "the workers finished with different models"
    check_epochs_cover_every_sample(logs, epochs=10)


@pytest.mark.timeout(120)
def test_a_worker_still_starting_when_the_job_finishes_is_stopped_not_waited_for(tmp_path):
    """Discovery adds a slot near the end; its worker takes 60 s to start. The members finish meanwhile: the job
    ends with them, stopping the newcomer (no failure), instead of waiting for it to start and then to time out
    waiting for a round that never comes."""
    slots, proc = start_job_on_slots(
        tmp_path,
        "localhost:2",
        np=2,
        max_np=3,
        epochs=2,
        extra=["--discovery-interval", "0.5", "--elastic-timeout", "60"],
        env={"ELASTIC_SLOW_START": "w2=60"},
    )
    try:
        wait_for_first_commits(tmp_path)
        slots.write_text("localhost:3\n")
        wait_for(lambda: "w2" in events(tmp_path), 30, "the added worker w2 to start")
        added = time.monotonic()
        out = finish(proc, timeout=90)
        took = time.monotonic() - added
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-5000:]
    assert took < 40, (took, out[-5000:])  # well before w2's start-up (60 s) ends
    assert "stopping worker w2 (not yet in a round on localhost): the job is finishing" in out, out[-5000:]
    assert "exited with code" not in out, out[-5000:]
    logs = events(tmp_path)
    assert [e["event"] for e in logs["w2"]] == ["start"], logs["w2"]
    done = {w: next(e for e in log if e["event"] == "done") for w, log in logs.items() if w != "w2"}
    assert set(done) == {"w0", "w1"} and len({tuple(d["weights"]) for d in done.values()}) == 1, done
    check_epochs_cover_every_sample({w: logs[w] for w in done}, epochs=2)


def _has_worker(worker: str) -> bool:
    try:
        worker_pid(worker, JOB)
        return True
    except AssertionError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cooldown", [None, ("5", "5")])
def test_failure_message_says_what_blacklisting_does(tmp_path, cooldown):
    """A worker that exits 3 on the only host: the message says that the job goes on with the others, which still
    run on that host, and that no new worker starts there (for good, or for the cooldown)."""
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:3\n")
    discover.chmod(0o755)
    worker = "import os, sys, time\nif os.environ['HVDLITE_WORKER_ID'] == 'w1':\n    sys.exit(3)\ntime.sleep(3)\n"
    extra = ["--blacklist-cooldown-range", *cooldown] if cooldown else []
    result = subprocess.run(
        [
            hvdlite_run(),
            "-np",
            "3",
            "--min-np",
            "1",
            "--max-np",
            "3",
            "--host-discovery-script",
            str(discover),
            "--discovery-interval",
            "0.2",
            *extra,
            sys.executable,
            "-c",
            worker,
        ],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]  # the others finished
    ban = (
        "for the rest of the job (blacklisted; --blacklist-cooldown-range allows it again after a while)"
        if cooldown is None
        else "for the next 5 s (blacklisted; --blacklist-cooldown-range 5 5)"
    )
    assert (
        "worker w1 (not yet in a round, on localhost) exited with code 3; the job re-forms with the 2 remaining "
        f"worker(s); no new worker starts on localhost {ban}; its 2 other worker(s) there go on"
    ) in out, out
    assert "re-forming the job without it" not in out
    assert "w3" not in out, out  # no worker replaced it
