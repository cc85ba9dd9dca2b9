"""hvdlite.spark.run on a real Spark cluster in local-cluster mode: a standalone master and two workers, each
worker's executor a JVM of its own (2 cores, so 4 task slots) whose tasks run in Python worker processes, as on
a real cluster. One SparkSession serves the whole module: starting the JVMs is the slow part."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import cloudpickle
import pytest
from launcher_helpers import processes_with_marker, wait_until
from multiproc import REPO_ROOT, job_env

SLOTS = 4  # local-cluster[2,2,...]: two executors of two cores
RANK_MARKER = "hvdlite.spark.rank"  # on every rank process's command line

# The ranks cannot import this test module: its functions travel by value, as a notebook's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Java is not installed; make test installs it (tools/system-packages.sh)")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        pytest.fail("pyspark is not installed; make test installs it (setup.py's spark extra)")
    from pyspark import SparkContext

    saved = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python workers: this virtualenv's
    session = (
        SparkSession.builder.master(f"local-cluster[2,{SLOTS // 2},1024]")
        .appName("hvdlite-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYTHONPATH", job_env()["PYTHONPATH"])
        .getOrCreate()
    )
    try:
        session.sparkContext.setLogLevel("ERROR")
        jsc = session.sparkContext._jsc.sc()
        registered = wait_until(lambda: jsc.getExecutorMemoryStatus().size() == 3, timeout=120, interval=0.2)
        assert registered, "the two executors did not register with the driver"
        yield session
    finally:
        session.stop()
        gateway = SparkContext._gateway
        if gateway is not None:  # the driver's JVM: stop it, so that it leaves with this module
            gateway.shutdown()
            gateway.proc.terminate()
            gateway.proc.wait(timeout=30)
            SparkContext._gateway = SparkContext._jvm = None
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved


def _no_rank_left(within: float = 5.0) -> None:
    assert wait_until(lambda: not processes_with_marker(RANK_MARKER), timeout=within), (
        f"rank processes left behind: {processes_with_marker(RANK_MARKER)}"
    )


def collectives(scale):
    import torch

    import hvdlite.torch as hvd

    placement_before_init = {name: os.environ[f"HOROVOD_{name}"] for name in ("RANK", "SIZE", "LOCAL_RANK")}
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.full((3,), float(r + 1)) * scale, op=hvd.Sum, name="total")
    gathered = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int64), name="ragged")
    shared = hvd.broadcast_object({"from": r}, root_rank=n - 1)
    print(f"hello from rank {r}", flush=True)
    print(f"rank {r} on stderr", file=sys.stderr, flush=True)
    return {
        "rank": r,
        "size": n,
        "local": (hvd.local_rank(), hvd.local_size()),
        "cross": (hvd.cross_rank(), hvd.cross_size()),
        "total": total.tolist(),
        "gathered": gathered[:, 0].tolist(),
        "shared": shared,
        "before_init": placement_before_init,
        "start_timeout": os.environ["HVDLITE_START_TIMEOUT"],
        "pid": os.getpid(),
    }


def test_ranks_run_collectives_and_return_in_rank_order(spark, capsys):
    """num_proc defaults to spark.default.parallelism (4 here); co-located ranks are on one host."""
    started = time.monotonic()
    results = __import__("hvdlite.spark").spark.run(collectives, args=(2.0,), start_timeout=90)
    elapsed = time.monotonic() - started
    assert [r["rank"] for r in results] == list(range(SLOTS)), results
    for rank, result in enumerate(results):
        assert result["size"] == SLOTS
        assert result["local"] == (rank, SLOTS) and result["cross"] == (0, 1), result
        assert result["total"] == [2.0 * SLOTS * (SLOTS + 1) / 2] * 3
        assert result["gathered"] == [k for k in range(SLOTS) for _ in range(k + 1)]
        assert result["shared"] == {"from": SLOTS - 1}
        assert result["before_init"] == {"RANK": str(rank), "SIZE": str(SLOTS), "LOCAL_RANK": str(rank)}
        assert result["start_timeout"] == "90"
    assert len({r["pid"] for r in results}) == SLOTS
    out, err = capsys.readouterr()
    for rank in range(SLOTS):
        assert f"[{rank}]<stdout>: hello from rank {rank}\n" in out, out
        assert f"[{rank}]<stderr>: rank {rank} on stderr\n" in err, err
    _no_rank_left()
    print(f"4-rank run: {elapsed:.1f} s", file=sys.__stderr__)


def describe(label, repeat=1):
    import numpy as np

    print(f"{label}: step 1\r{label}: step 2\r{label}: done", flush=True)  # a progress line drawn in place
    return {
        "env": os.environ.get("SPARK_TEST_VARIABLE"),
        "array": np.arange(3) * repeat,
        "local_size": os.environ["HVDLITE_LOCAL_SIZE"],
    }


def test_kwargs_env_and_output_streams(spark):
    """Results travel pickled (numpy here); env reaches the ranks; stdout= receives the ranks' lines with
    Horovod's timestamp prefix, a progress line as its final state."""
    from hvdlite.spark import run

    out = io.StringIO()
    results = run(
        describe,
        args=("work",),
        kwargs={"repeat": 2},
        num_proc=2,
        env={"SPARK_TEST_VARIABLE": "yes"},
        stdout=out,
        prefix_output_with_timestamp=True,
        verbose=0,
    )
    assert [r["env"] for r in results] == ["yes", "yes"]
    assert [r["array"].tolist() for r in results] == [[0, 2, 4]] * 2
    assert [r["local_size"] for r in results] == ["2", "2"]
    lines = out.getvalue().splitlines()
    for rank in (0, 1):
        stamped = [
            line
            for line in lines
            if re.fullmatch(
                r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"
                rf"\[{rank}\]<stdout>: work: done",
                line,
            )
        ]
        assert len(stamped) == 1, lines


def unhappy_rank_two():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    if hvd.rank() == 2:
        raise ValueError("rank two is unhappy")
    hvd.allreduce(torch.ones(1), name="never_completes")  # the others wait here for rank 2


def killed_rank_one():
    import signal

    import torch

    import hvdlite.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if hvd.rank() == 0:
        hvd.allreduce(torch.ones(1), name="lost_peer")  # fails at once, naming rank 1: a consequence
    time.sleep(600)  # rank 2 must be stopped, not waited for


def test_a_failing_rank_stops_the_job_and_is_named(spark):
    from hvdlite.spark import RunError, run

    started = time.monotonic()
    with pytest.raises(RunError) as failure:
        run(unhappy_rank_two, num_proc=SLOTS, verbose=0)
    assert time.monotonic() - started < 40, "the ranks blocked in the allreduce must be stopped, not waited for"
    error = failure.value
    assert error.rank == 2, error
    assert "rank 2 (Spark partition 2 on" in str(error) and "ValueError: rank two is unhappy" in str(error)
    assert (
        "in unhappy_rank_two" in error.remote_traceback
        and "ValueError: rank two is unhappy" in error.remote_traceback
    )
    _no_rank_left()

    started = time.monotonic()
    with pytest.raises(RunError) as failure:
        run(killed_rank_one, num_proc=3, verbose=0)
    assert time.monotonic() - started < 30, "the sleeping rank must be stopped"
    # The cause, not rank 0's PeerError that may well arrive first
    assert failure.value.rank == 1 and failure.value.exit_code == 128 + 9, failure.value
    assert "exited with code 137 without a Python exception" in str(failure.value)
    _no_rank_left()

    # The Spark jobs ended: every slot is free again for the next run.
    assert run(lambda: int(os.environ["HVDLITE_RANK"]) * 10, num_proc=SLOTS, verbose=0) == [0, 10, 20, 30]
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def sleeps():
    time.sleep(600)


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_killed_task_takes_its_rank_with_it(spark):
    """What Spark does to a cancelled task (or a lost executor does to all of them): its Python worker is
    killed. The rank in it dies at once; the run fails naming the Spark job's failure; no rank is left."""
    from hvdlite.spark import RunError, run

    killed = {}

    def kill_one_task():
        if wait_until(lambda: len(processes_with_marker(RANK_MARKER)) == 2, timeout=60):
            rank = processes_with_marker(RANK_MARKER)[0]
            os.kill(_parent_of(rank), 9)  # the Spark task's Python worker
            killed["rank_gone"] = wait_until(lambda: rank not in processes_with_marker(RANK_MARKER), timeout=2)

    killer = threading.Thread(target=kill_one_task, daemon=True)
    killer.start()
    started = time.monotonic()
    with pytest.raises(RunError, match="the Spark job failed") as failure:
        run(sleeps, num_proc=2, verbose=0)
    assert time.monotonic() - started < 60
    killer.join()
    assert killed == {"rank_gone": True}, "the rank outlived its task"
    assert "Python worker exited unexpectedly" in str(failure.value), failure.value
    _no_rank_left()
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_more_ranks_than_task_slots_is_a_clear_error(spark):
    from hvdlite.spark import run

    started = time.monotonic()
    with pytest.raises(
        TimeoutError,
        match=rf"num_proc={SLOTS + 1} needs {SLOTS + 1} Spark task slots at once .*"
        rf"the cluster has {SLOTS}",
    ):
        run(print, num_proc=SLOTS + 1, start_timeout=3, verbose=0)
    assert time.monotonic() - started < 10
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_start_timeout_when_task_slots_are_busy(spark):
    """Enough slots in the cluster, but another job holds one: the barrier stage cannot start, and run gives
    up after start_timeout, cancelling its Spark job."""
    from hvdlite.spark import run

    sc = spark.sparkContext
    errors = []

    def occupy_one_slot():
        sc.setJobGroup("occupier", "holds one task slot", interruptOnCancel=True)
        try:
            sc.parallelize([0], 1).map(lambda _: time.sleep(120)).collect()
        except Exception as error:  # noqa: BLE001 - cancelled below
            errors.append(error)

    occupier = threading.Thread(target=occupy_one_slot, daemon=True)
    occupier.start()
    tracker = sc.statusTracker()
    assert wait_until(
        lambda: any(
            stage.numActiveTasks == 1
            for job in tracker.getActiveJobsIds()
            for stage in [tracker.getStageInfo(s) for s in tracker.getJobInfo(job).stageIds]
            if stage is not None
        ),
        timeout=60,
        interval=0.2,
    )
    try:
        started = time.monotonic()
        with pytest.raises(
            TimeoutError,
            match=rf"only 0 of num_proc={SLOTS} Spark tasks started within "
            r"start_timeout=4 s.*cluster has 4 task slots",
        ):
            run(print, num_proc=SLOTS, start_timeout=4, verbose=0)
        assert time.monotonic() - started < 15
    finally:
        sc.cancelJobGroup("occupier")
        occupier.join(timeout=60)
    assert errors and not occupier.is_alive()
    assert wait_until(lambda: tracker.getActiveJobsIds() == [], timeout=30)


def test_plain_tasks_where_spark_refuses_barrier_stages(spark, monkeypatch):
    """Under dynamic allocation Spark refuses barrier stages; the ranks then run as plain tasks (Horovod's
    way). The same job, forced into that mode."""
    import hvdlite.spark.runner as runner

    monkeypatch.setattr(runner, "_dynamic_allocation", lambda spark_context: True)
    results = runner.run(collectives, args=(1.0,), num_proc=2, verbose=0)
    assert [(r["rank"], r["total"]) for r in results] == [(0, [3.0] * 3), (1, [3.0] * 3)]
    _no_rank_left()


def test_arguments_horovod_has_and_hvdlite_cannot_honour(spark, monkeypatch):
    from pyspark import SparkContext

    from hvdlite.spark import run

    with pytest.raises(ValueError, match="use_mpi=True is not supported"):
        run(print, num_proc=2, use_mpi=True)
    with pytest.raises(ValueError, match="extra_mpi_args='-x FOO' cannot take effect"):
        run(print, num_proc=2, extra_mpi_args="-x FOO")
    assert run(lambda: "gloo is fine", num_proc=1, use_gloo=True, use_mpi=False, verbose=0) == ["gloo is fine"]
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    with pytest.raises(RuntimeError, match="could not find an active SparkContext"):
        run(print, num_proc=2)


def test_spark_example_trains():
    """examples/spark_train.py as a user runs it: it starts its own local Spark, trains, prints the weights."""
    example = os.path.join(REPO_ROOT, "examples", "spark_train.py")
    result = subprocess.run(
        [sys.executable, example, "--master", "local[2]", "--epochs", "3"],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    final_loss = float(result.stdout.split("epoch 2: loss ")[1].split()[0])
    assert final_loss < 0.01, result.stdout
    learned = [float(w) for w in result.stdout.split("learned weights ")[1].split("|")[0].split()]
    assert max(abs(a - b) for a, b in zip(learned, [2.0, -3.0, 0.5, 1.0])) < 0.05, result.stdout
