"""``hvdlite.spark.run(fn, num_proc=N)``: an hvdlite job whose ranks run in Spark tasks (Horovod's
``horovod.spark.run``).

How a run goes:

1. The driver serves the job's rendezvous (the launcher's authenticated service, fresh secret) on the address
   the executors already reach it at (``spark.driver.host``, or the first of ``nics`` it has), and stores the
   pickled function there as ``hvdlite.run(fn)`` does.
2. One Spark job of ``num_proc`` partitions starts, in barrier mode: Spark launches all its tasks together or
   none. The driver first waits (up to ``start_timeout``: executors may still be arriving) for the cluster to
   have ``num_proc`` task slots, and fails naming both numbers if it never does, where Spark would retry its own
   check silently for minutes. Under dynamic allocation Spark refuses barrier stages, so there the tasks are
   plain ones, as in Horovod, and ``start_timeout`` bounds the wait for the last of them.
3. Each task reports its host; ranks are numbered host by host (hosts in the order of their first partition,
   partitions in order within a host), so rank 0 is partition 0 and co-located ranks are consecutive and share
   memory. Each task then runs its rank in a child process with the launcher's variables (task.py).
4. The driver forwards the ranks' output and collects the results in rank order. When a rank fails, every rank
   is stopped (the others are probably blocked in a collective waiting for it), the Spark job ends, and
   ``RunError`` names the failing rank with its traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from hvdlite.common import network
from hvdlite.common.rendezvous import RendezvousClient, RendezvousServer
from hvdlite.common.topology import topology_for_hosts
from hvdlite.runner.api import RUN_SCOPE, RunError, build_rank_env, get_blob, pack_call, put_blob
from hvdlite.spark import protocol
from hvdlite.spark.output import RankOutput
from hvdlite.spark.protocol import TaskSpec
from hvdlite.spark.task import TERMINATE_GRACE_SECONDS, run_partition

logger = logging.getLogger("hvdlite.spark")

#: Horovod's default start timeout for Spark (HOROVOD_SPARK_START_TIMEOUT overrides it).
DEFAULT_START_TIMEOUT = 600.0
#: How long the ranks get to exit once every result is in, before they are stopped.
EXIT_GRACE_SECONDS = 30.0
#: How long the driver keeps collecting failures after the first, to tell the cause from its consequences.
FAILURE_SETTLE_SECONDS = 1.0
_POLL_SECONDS = 0.05


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    num_proc: Optional[int] = None,
    start_timeout: Optional[float] = None,
    use_mpi: Optional[bool] = None,
    use_gloo: Optional[bool] = None,
    extra_mpi_args: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    stdout=None,
    stderr=None,
    verbose: int = 1,
    nics: Optional[Union[str, Iterable[str]]] = None,
    prefix_output_with_timestamp: bool = False,
    executable: Optional[str] = None,
) -> List[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` ranks, one per Spark task, and returns the results in rank
    order. ``fn`` calls ``hvd.init()`` itself, as a training script does.

    Horovod's arguments, with their meaning:

    - ``num_proc``: default ``spark.default.parallelism`` (``sc.defaultParallelism``).
    - ``start_timeout`` (s): bounds the wait for the cluster's task slots and for every task to start, and each
      rank's ``hvd.init()`` (HVDLITE_START_TIMEOUT). Default: ``HOROVOD_SPARK_START_TIMEOUT``, else 600.
    - ``env``: variables added to every rank's environment (on top of its executor's).
    - ``stdout``/``stderr``: text streams that receive the ranks' output, line by line with rank prefixes
      (default ``sys.stdout``/``sys.stderr``); ``prefix_output_with_timestamp`` puts the time first.
    - ``verbose``: 0 quiet, 1 (default) logs the job's shape, 2 also each task, on the ``hvdlite.spark`` logger.
    - ``nics``: network interfaces (names, or one comma-separated string) for the ranks' connections and the
      driver's rendezvous address (HVDLITE_NETWORK_INTERFACE).
    - ``executable``: the Python that runs each rank (default: the executor's Python, the one Spark runs
      the task with; Horovod defaults to the driver's ``sys.executable``, which need not exist on executors).
    - ``use_gloo``: accepted; hvdlite's own transport plays Gloo's part. ``use_mpi=True`` and
      ``extra_mpi_args`` raise ValueError: the ranks are Spark's tasks, connected by hvdlite's transport, and no
      ``mpirun`` is involved, so MPI arguments cannot take effect (and are not silently dropped).

    Raises :class:`hvdlite.runner.api.RunError` naming the rank and carrying its traceback when a rank fails
    (or the Spark job fails), :class:`TimeoutError` when the ranks cannot all start within ``start_timeout``,
    :class:`RuntimeError` without an active SparkContext.
    """
    import pyspark

    if use_mpi:
        raise ValueError(
            "hvdlite.spark.run: use_mpi=True is not supported: the ranks run in Spark tasks and "
            "connect through hvdlite's own transport (the Gloo mode of Horovod); no mpirun is "
            "involved. Leave use_mpi unset."
        )
    if extra_mpi_args:
        raise ValueError(
            f"hvdlite.spark.run: extra_mpi_args={extra_mpi_args!r} cannot take effect: no mpirun is "
            "involved (the ranks run in Spark tasks). Pass environment variables with env=, "
            "tuning knobs as HVDLITE_* variables in env=."
        )
    del use_gloo  # hvdlite's transport is always used; any value is fine
    spark_context = pyspark.SparkContext._active_spark_context
    if spark_context is None:
        raise RuntimeError(
            "hvdlite.spark.run: could not find an active SparkContext; are you running in a PySpark session?"
        )
    if num_proc is None:
        num_proc = spark_context.defaultParallelism
        _log(verbose, 1, "running %d processes (inferred from spark.default.parallelism)", num_proc)
    else:
        _log(verbose, 1, "running %d processes", num_proc)
    if num_proc < 1:
        raise ValueError(f"hvdlite.spark.run: num_proc must be at least 1, got {num_proc}")
    if start_timeout is None:
        start_timeout = float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", DEFAULT_START_TIMEOUT))
    if start_timeout <= 0:
        raise ValueError(f"hvdlite.spark.run: start_timeout must be positive, got {start_timeout}")
    nic_list = [nic.strip() for nic in (nics.split(",") if isinstance(nics, str) else nics or []) if nic.strip()]

    job = _Run(
        spark_context,
        num_proc,
        float(start_timeout),
        nic_list,
        dict(env or {}),
        executable,
        RankOutput(stdout, stderr, prefix_output_with_timestamp),
        verbose,
    )
    return job.run(pack_call(fn, args, kwargs))


def _log(verbose: int, level: int, message: str, *args) -> None:
    if verbose >= level:
        logger.info(message, *args)


class _Failure(Exception):
    """Ends the monitoring of a run; carries the exception to raise once the job is stopped."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class _Run:
    """One run: the rendezvous, the Spark job on its own thread, and the driver's bookkeeping."""

    def __init__(
        self,
        spark_context,
        num_proc: int,
        start_timeout: float,
        nics: List[str],
        user_env: Dict[str, str],
        executable: Optional[str],
        output: RankOutput,
        verbose: int,
    ):
        self.sc = spark_context
        self.num_proc = num_proc
        self.start_timeout = start_timeout
        self.nics = nics
        self.user_env = user_env
        self.executable = executable
        self.output = output
        self.verbose = verbose
        self.job_id = "spark-" + secrets.token_hex(4)
        self.group = "hvdlite.spark.run." + self.job_id
        self.secret = secrets.token_bytes(32)
        self.barrier = not _dynamic_allocation(spark_context)
        self.hosts: List[str] = []  # host of each rank
        self.rank_of: Dict[int, int] = {}  # partition -> rank
        self.results: Dict[int, Any] = {}
        self.exit_codes: Dict[int, int] = {}
        self.next_output: Dict[int, int] = {}
        self._thread: Optional[threading.Thread] = None
        self._done = threading.Event()
        self._spark_error: Optional[BaseException] = None
        self._spark_result: List[dict] = []  # what the tasks returned, once the Spark job is over
        self._spark_failure_seen: Optional[RunError] = None
        self.failed: set = set()  # ranks whose failure is known

    # ------------------------------------------------------------------ the run

    def run(self, payload: bytes) -> List[Any]:
        bind, address = _rendezvous_addresses(self.sc, self.nics)
        server = RendezvousServer(self.secret, host=bind).start()
        try:
            self.port = server.address[1]
            self.address = address
            self.server = server
            self.client = RendezvousClient(bind, self.port, self.secret)
            put_blob(self.client, "fn", payload)
            try:
                deadline = time.monotonic() + self.start_timeout
                if self.barrier:
                    self._wait_for_slots(deadline)
                self._start_spark_job()
                self._assign_ranks(self._wait_for_tasks(deadline))
                self._wait_for_results()
            except _Failure as failure:
                self._stop(str(failure))
                raise failure.error from failure.error.__cause__
            except BaseException:  # KeyboardInterrupt included: never leave ranks running
                self._stop("the driver was interrupted")
                raise
            self._finish()
            return [self.results[rank] for rank in range(self.num_proc)]
        finally:
            self.output.close()
            server.stop()

    # ------------------------------------------------------------------ start-up

    def _wait_for_slots(self, deadline: float) -> None:
        """A barrier stage needs every task slot at once: wait (until the deadline) for the cluster to have
        num_proc of them, so that too small a cluster is a clear error rather than Spark's silent retries."""
        slots = _task_slots(self.sc)
        while slots is not None and slots < self.num_proc:
            if time.monotonic() >= deadline:
                raise _Failure(
                    TimeoutError(
                        f"hvdlite.spark.run: num_proc={self.num_proc} needs {self.num_proc} Spark task slots at once "
                        f"(each rank is a task of one barrier stage), but the cluster has {slots} (executor cores / "
                        f"spark.task.cpus), still after start_timeout={self.start_timeout:g} s. Use num_proc <= "
                        f"{slots}, or add executors."
                    )
                )
            time.sleep(0.5)
            slots = _task_slots(self.sc)

    def _start_spark_job(self) -> None:
        from pyspark import InheritableThread

        spec = TaskSpec(
            rendezvous_host=self.address,
            rendezvous_port=self.port,
            secret=self.secret,
            job_id=self.job_id,
            start_timeout=self.start_timeout,
            executable=self.executable,
        )
        mapper = functools.partial(run_partition, spec)

        def spark_job():
            try:
                self.sc.setJobGroup(self.group, f"hvdlite.spark.run: {self.num_proc} ranks", interruptOnCancel=True)
                partitions = self.sc.parallelize(range(self.num_proc), self.num_proc)
                stage = partitions.barrier() if self.barrier else partitions
                self._spark_result = stage.mapPartitionsWithIndex(mapper).collect()
            except BaseException as error:  # noqa: B902 - reported by the driver's thread
                self._spark_error = error
            finally:
                self._done.set()

        self._thread = InheritableThread(target=spark_job, name=f"hvdlite-{self.group}", daemon=True)
        self._thread.start()

    def _wait_for_tasks(self, deadline: float) -> Dict[int, dict]:
        """Every partition's report, or a TimeoutError naming how many started."""
        tasks: Dict[int, dict] = {}
        while True:
            state = self.server.snapshot().get(protocol.SCOPE, {})
            for index in range(self.num_proc):
                raw = state.get(protocol.task_key(index))
                if raw is not None and index not in tasks:
                    tasks[index] = json.loads(raw)
                    _log(
                        self.verbose,
                        2,
                        "partition %d started on %s (pid %d)",
                        index,
                        tasks[index]["host"],
                        tasks[index]["pid"],
                    )
            if len(tasks) == self.num_proc:
                return tasks
            error = self._spark_failure(f"{len(tasks)} of {self.num_proc} tasks had started")
            if error is not None:
                raise _Failure(error)
            if time.monotonic() >= deadline:
                slots = _task_slots(self.sc)
                raise _Failure(
                    TimeoutError(
                        f"hvdlite.spark.run: only {len(tasks)} of num_proc={self.num_proc} Spark tasks started "
                        f"within "
                        f"start_timeout={self.start_timeout:g} s. Each rank runs in a Spark task, and "
                        + (
                            "a barrier stage starts only when all its tasks have free slots at once"
                            if self.barrier
                            else "every task must run at the same time"
                        )
                        + (
                            f" (the cluster has {slots} task slots; others may be busy with other jobs)"
                            if slots is not None
                            else ""
                        )
                        + ". Free or add executors, or raise start_timeout (HOROVOD_SPARK_START_TIMEOUT) when "
                        "executors are allocated on demand."
                    )
                )
            time.sleep(_POLL_SECONDS)

    def _assign_ranks(self, tasks: Dict[int, dict]) -> None:
        """Ranks host by host: hosts in the order of their first partition, partitions in order within one."""
        hosts = _host_names(tasks)
        first_partition: Dict[str, int] = {}
        for index in range(self.num_proc):
            first_partition.setdefault(hosts[index], index)
        order = sorted(range(self.num_proc), key=lambda index: (first_partition[hosts[index]], index))
        self.hosts = [hosts[index] for index in order]
        knobs = {"HVDLITE_START_TIMEOUT": f"{self.start_timeout:g}"}
        if self.nics:
            knobs["HVDLITE_NETWORK_INTERFACE"] = ",".join(self.nics)
        for info, index in zip(topology_for_hosts(self.hosts), order):
            self.rank_of[index] = info.rank
            env = build_rank_env(
                info,
                rendezvous_addr=self.address,
                rendezvous_port=self.port,
                secret=self.secret,
                job_id=self.job_id,
                base_env=self.user_env,
            )
            env.update(knobs)
            self.client.put(
                protocol.SCOPE, protocol.assignment_key(index), json.dumps({"rank": info.rank, "env": env}).encode()
            )
        _log(
            self.verbose,
            1,
            "hvdlite.spark job %s: %d ranks on %s; rendezvous at %s:%d",
            self.job_id,
            self.num_proc,
            ", ".join(f"{host} ({self.hosts.count(host)})" for host in dict.fromkeys(self.hosts)),
            self.address,
            self.port,
        )

    # ------------------------------------------------------------------ running

    def _wait_for_results(self) -> None:
        """Until every rank has stored its result and exited 0, or a failure (raised as _Failure).

        When a rank fails, the others soon fail too (a lost peer, an aborted collective), and their reports
        may arrive first: a rank that died without a Python exception is noticed by its peers at once, but by
        its task only when it has reaped it. So failures are collected for FAILURE_SETTLE_SECONDS and the cause
        chosen: a rank that died (or a Spark failure) before a Python exception, then the first to arrive."""
        all_in_since: Optional[float] = None
        failures: List[tuple] = []  # (priority, arrival, RunError)
        decide_at: Optional[float] = None
        while True:
            snapshot = self.server.snapshot()
            self._forward_output(snapshot)
            state = snapshot.get(protocol.SCOPE, {})
            # Results in the order they arrived (the store keeps insertion order).
            for key in snapshot.get(RUN_SCOPE, {}):
                if key.startswith("result.") and key.count(".") == 1:
                    error = self._take_result(int(key.split(".")[1]))
                    if error is not None:
                        failures.append((1, len(failures), error))
            for index, rank in self.rank_of.items():
                raw = state.get(protocol.exit_key(index))
                if raw is not None and rank not in self.exit_codes:
                    self.exit_codes[rank] = json.loads(raw)["code"]
                    error = self._exit_failure(rank)
                    if error is not None:
                        failures.append((0, len(failures), error))
            if not failures and len(self.exit_codes) == self.num_proc:
                return
            error = self._spark_failure(f"{len(self.exit_codes)} of {self.num_proc} ranks had finished")
            if error is not None and not any(failure[2] is error for failure in failures):
                failures.append((0, len(failures), error))
            if failures:
                decide_at = decide_at or time.monotonic() + FAILURE_SETTLE_SECONDS
                if time.monotonic() >= decide_at:
                    raise _Failure(min(failures, key=lambda failure: failure[:2])[2])
            elif len(self.results) == self.num_proc:
                all_in_since = all_in_since or time.monotonic()
                if time.monotonic() - all_in_since > EXIT_GRACE_SECONDS:
                    waiting = [rank for rank in range(self.num_proc) if rank not in self.exit_codes]
                    logger.warning(
                        "hvdlite.spark: ranks %s stored their results but did not exit within %g s; stopping them",
                        waiting,
                        EXIT_GRACE_SECONDS,
                    )
                    self._stop("the ranks did not exit after storing their results")
                    return
            self.output.tick()
            time.sleep(_POLL_SECONDS)

    def _take_result(self, rank: int) -> Optional[RunError]:
        """Reads a rank's stored outcome once: keeps a result, returns the RunError of a traceback."""
        if rank in self.results or rank in self.failed:
            return None
        import cloudpickle

        status, value = cloudpickle.loads(get_blob(self.client, f"result.{rank}", wait=0))
        if status == "error":
            self.failed.add(rank)
            return RunError(
                f"hvdlite.spark.run: rank {rank} ({self._where(rank)}) failed; every rank was stopped.\n{value}",
                rank,
                1,
                value,
            )
        self.results[rank] = value
        return None

    def _exit_failure(self, rank: int) -> Optional[RunError]:
        """The failure a rank's exit shows, if any that its stored outcome does not already tell."""
        code = self.exit_codes[rank]
        if rank in self.failed or (code == 0 and rank in self.results):
            return None
        try:
            error = self._take_result(rank)  # the result (or a traceback) may have arrived with the exit
        except TimeoutError:
            error = None
        if error is not None or rank in self.failed or (code == 0 and rank in self.results):
            return error
        self.failed.add(rank)
        if code == 0:
            return RunError(
                f"hvdlite.spark.run: rank {rank} ({self._where(rank)}) exited without storing a "
                "result (did fn call os._exit?)",
                rank,
                0,
                None,
            )
        return RunError(
            f"hvdlite.spark.run: rank {rank} ({self._where(rank)}) exited with code {code} without a "
            "Python exception (killed, or it crashed); its output is above",
            rank,
            code,
            None,
        )

    def _where(self, rank: int) -> str:
        index = next(index for index, r in self.rank_of.items() if r == rank)
        return f"Spark partition {index} on {self.hosts[rank]}"

    def _spark_failure(self, progress: str) -> Optional[RunError]:
        """The Spark job's failure, once it is over without every rank's exit; None while it runs or when it
        ended well."""
        if not self._done.is_set():
            return None
        if self._spark_failure_seen is not None:
            return self._spark_failure_seen
        error = self._spark_error
        if error is not None:
            failure = RunError(
                f"hvdlite.spark.run: the Spark job failed when {progress}: {_summary(error)}", None, 1, None
            )
            failure.__cause__ = error
        else:
            # The tasks return only after reporting their rank's exit: read the state once more before judging.
            state = self.server.snapshot().get(protocol.SCOPE, {})
            if self.rank_of and all(state.get(protocol.exit_key(index)) is not None for index in self.rank_of):
                return None
            retried = [
                f"partition {task['index']} (attempt {task['retried']})"
                for task in self._spark_result
                if "retried" in task
            ]
            failure = RunError(
                f"hvdlite.spark.run: the Spark job ended when {progress}"
                + (
                    f"; Spark ran {', '.join(retried)} again after a failed or lost attempt (see the Spark logs), "
                    "and a rank cannot be replaced in a running job"
                    if retried
                    else ""
                ),
                None,
                1,
                None,
            )
        self._spark_failure_seen = failure
        return failure

    def _forward_output(self, snapshot: Dict[str, Dict[str, bytes]]) -> None:
        for rank in range(self.num_proc):
            seq = self.next_output.get(rank, 0)
            while True:
                scope = protocol.output_scope(rank, seq)
                batch = snapshot.get(scope, {}).get(protocol.OUTPUT_KEY)
                if batch is None:
                    break
                for stream, data in protocol.decode_output(batch):
                    self.output.feed(rank, stream, data)
                self.client.delete_scope(scope)
                seq += 1
            self.next_output[rank] = seq

    # ------------------------------------------------------------------ ending

    def _finish(self) -> None:
        """After success: the Spark job ends as its tasks return; the last output is written."""
        self._join_spark_job(TERMINATE_GRACE_SECONDS + 10)
        self._forward_output(self.server.snapshot())

    def _stop(self, reason: str) -> None:
        """Stops every rank (abort, then cancelling the Spark job if its tasks do not end), writes what they
        printed until then."""
        logger.debug("hvdlite.spark job %s: stopping: %s", self.job_id, reason)
        try:
            self.client.put(protocol.SCOPE, protocol.ABORT_KEY, reason.encode())
        except OSError:
            pass
        if self._thread is None:
            return
        # Once every task has its rank, the tasks stop their ranks and return. Before that, some tasks may
        # never start (no free slots) or may start only later: cancel at once. Spark kills the Python workers
        # of running tasks, and their ranks die with them (PR_SET_PDEATHSIG, rank.py).
        if len(self.rank_of) < self.num_proc or not self._join_spark_job(TERMINATE_GRACE_SECONDS + 5):
            try:
                self.sc.cancelJobGroup(self.group)
            except Exception as error:  # noqa: BLE001 - e.g. the SparkContext was stopped meanwhile
                logger.warning("hvdlite.spark: cannot cancel the Spark job group %s: %s", self.group, error)
            if not self._join_spark_job(30):
                logger.warning("hvdlite.spark: the Spark job group %s did not end after cancelling it", self.group)
        try:
            self._forward_output(self.server.snapshot())
        except OSError:
            pass

    def _join_spark_job(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._done.wait(_POLL_SECONDS * 4):
            self._forward_output(self.server.snapshot())
            self.output.tick()
            if time.monotonic() >= deadline:
                return False
        return True


# ---------------------------------------------------------------------- Spark facts


def _dynamic_allocation(spark_context) -> bool:
    """Spark's rule (Utils.isDynamicAllocationEnabled): configured, and not a local[...] master."""
    conf = spark_context.getConf()
    enabled = conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true"
    master = spark_context.master
    local = master == "local" or master.startswith("local[")
    testing = conf.get("spark.dynamicAllocation.testing", "false").strip().lower() == "true"
    return enabled and (not local or testing)


def _task_slots(spark_context) -> Optional[int]:
    """How many tasks the cluster runs at once (executor cores / spark.task.cpus over live executors), as the
    scheduler counts them for barrier stages; None where this Spark does not tell."""
    try:
        jsc = spark_context._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - an internal API: without it the start timeout still bounds the wait
        return None


def _rendezvous_addresses(spark_context, nics: List[str]):
    """(address to bind, address the ranks use): the first of ``nics`` this machine has, else the address the
    executors reach the driver at (``spark.driver.host``; bound on ``spark.driver.bindAddress`` if set, as Spark
    binds its own services behind NAT)."""
    if nics:
        address = network.first_interface_ipv4(nics)
        if address is None:
            raise ValueError(
                f"hvdlite.spark.run: none of the network interfaces {','.join(nics)} has an IPv4 "
                "address on the driver"
            )
        return address, address
    conf = spark_context.getConf()
    host = conf.get("spark.driver.host", None) or socket.gethostname()
    address = socket.gethostbyname(host)
    bind = conf.get("spark.driver.bindAddress", None)
    return (socket.gethostbyname(bind) if bind else address), address


def _host_names(tasks: Dict[int, dict]) -> Dict[int, str]:
    """Each partition's host identity: its hostname, with the namespaces' id appended where one hostname
    hides several namespaces (containers), which cannot share memory."""
    namespaces: Dict[str, set] = {}
    for task in tasks.values():
        namespaces.setdefault(task["host"], set()).add(task["namespace"])
    return {
        index: task["host"] if len(namespaces[task["host"]]) == 1 else f"{task['host']}-{task['namespace']}"
        for index, task in tasks.items()
    }


def _summary(error: BaseException) -> str:
    """A Spark failure in a few lines: Py4J errors carry the whole Java stack."""
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith(("at ", "... "))]
    return "\n".join(lines[:40])
