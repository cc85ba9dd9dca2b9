"""The Spark task behind each rank of ``hvdlite.spark.run``: runs inside an executor's Python worker.

It reports where it runs, waits for the driver to assign its rank, and runs the rank in a child process
(``python -m hvdlite.spark.rank``), not in the Python worker itself: hvdlite's runtime, its threads and signal
handling then never mix with a worker that Spark reuses for later tasks, and the rank can be stopped as a
whole. While the rank runs, the task sends its output to the driver and watches for the driver's ``abort``
(another rank failed, or the driver gave up): then the rank's process group gets SIGTERM and, after
``TERMINATE_GRACE_SECONDS``, SIGKILL. Should Spark kill the worker instead (a cancelled job, a lost executor),
the rank dies with it (rank.py). Protocol: protocol.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from hvdlite.common.rendezvous import RendezvousClient, RendezvousError
from hvdlite.spark import protocol
from hvdlite.spark.protocol import TaskSpec

#: Time a rank gets between SIGTERM and SIGKILL when it is stopped.
TERMINATE_GRACE_SECONDS = 5.0
#: Largest batch of output in one request (the rendezvous service takes up to 1 MiB).
_MAX_BATCH = 512 * 1024
#: How long one wait for the driver's abort lasts before the watcher checks whether the rank is done.
_ABORT_POLL_SECONDS = 1.0


def run_partition(spec: TaskSpec, index: int, _rows) -> List[dict]:
    """The Spark mapper (``mapPartitionsWithIndex``): one rank per partition; returns what happened, for the
    Spark job's own result (the driver reads the job's state from the rendezvous)."""
    return [_Task(spec, index).run()]


class _Task:
    def __init__(self, spec: TaskSpec, index: int):
        self.spec = spec
        self.index = index
        self.client = RendezvousClient(spec.rendezvous_host, spec.rendezvous_port, spec.secret, timeout=30)

    def run(self) -> dict:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        if attempt > 0:
            return self._stand_by(attempt)
        self._put(protocol.task_key(self.index), protocol.this_host())
        assignment = self._wait_for_assignment()
        if assignment is None:
            return {"index": self.index, "aborted": True}
        rank = assignment["rank"]

        def report_exit(code: int) -> None:
            # At once, before the last output: a rank that died is the cause of its peers' failures, and the
            # driver tells causes from consequences by what arrives first.
            self._put(protocol.exit_key(self.index), {"rank": rank, "code": code})

        code = _RankProcess(self, rank, assignment["env"]).run(report_exit)
        return {"index": self.index, "rank": rank, "code": code}

    def _stand_by(self, attempt: int) -> dict:
        """A second attempt of this partition (a retry, or a speculative copy) cannot join: a rank cannot be
        replaced in a running job. After a failed attempt the other ranks fail on their own (a lost peer) and
        the driver aborts the run. A speculative copy must not return before the first attempt: Spark would
        count the partition done and kill the attempt that runs the rank. So it waits for the run's end."""
        exit_key = protocol.exit_key(self.index)
        try:
            while not self.aborted(wait=0):
                try:
                    self.client.get(protocol.SCOPE, exit_key, wait=_ABORT_POLL_SECONDS)
                    break
                except TimeoutError:
                    continue
        except (OSError, RendezvousError):
            pass  # the driver is gone
        return {"index": self.index, "retried": attempt}

    def _put(self, key: str, value: dict) -> None:
        self.client.put(protocol.SCOPE, key, json.dumps(value).encode())

    def aborted(self, wait: float) -> bool:
        try:
            self.client.get(protocol.SCOPE, protocol.ABORT_KEY, wait=wait)
            return True
        except TimeoutError:
            return False

    def _wait_for_assignment(self) -> Optional[dict]:
        """The driver's assignment, or None when it aborted the run first. The driver gives up after the start
        timeout; the slack lets its abort arrive before this side gives up too."""
        deadline = time.monotonic() + self.spec.start_timeout + 30
        while time.monotonic() < deadline:
            try:
                return json.loads(self.client.get(protocol.SCOPE, protocol.assignment_key(self.index), wait=1.0))
            except TimeoutError:
                if self.aborted(wait=0):
                    return None
        raise TimeoutError(
            f"hvdlite.spark: the task of partition {self.index} got no rank from the driver "
            f"within {self.spec.start_timeout:.0f} s"
        )


class _RankProcess:
    """The rank's child process, its output pumps and the abort watcher."""

    def __init__(self, task: _Task, rank: int, rank_env: Dict[str, str]):
        self.task = task
        self.rank = rank
        self.env = dict(os.environ)
        self.env.update(rank_env)
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.pending: List[Tuple[int, bytes]] = []
        self.seq = 0
        self.proc: Optional[subprocess.Popen] = None

    def run(self, report_exit: Callable[[int], None]) -> int:
        """Runs the rank to its end; ``report_exit(code)`` as soon as it has exited, then its last output is
        sent. The code is the launcher's: 128 + signal number for a rank killed by a signal."""
        spec = self.task.spec
        command = [
            spec.executable or sys.executable,
            "-m",
            "hvdlite.spark.rank",
            "--parent",
            str(os.getpid()),
            "--job",
            spec.job_id,
        ]
        self.proc = subprocess.Popen(
            command,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        readers = [
            threading.Thread(
                target=self._read,
                args=(pipe, stream),
                daemon=True,
                name=f"hvdlite-rank{self.rank}-{protocol.STREAMS[stream]}",
            )
            for stream, pipe in enumerate((self.proc.stdout, self.proc.stderr))
        ]
        sender = threading.Thread(target=self._send_loop, daemon=True, name=f"hvdlite-rank{self.rank}-output")
        watcher = threading.Thread(target=self._watch_abort, daemon=True, name=f"hvdlite-rank{self.rank}-abort")
        for thread in readers + [sender, watcher]:
            thread.start()
        try:
            code = self.proc.wait()
            code = 128 - code if code < 0 else code
            _signal_group(self.proc.pid, signal.SIGKILL)  # what the rank started and left behind
            report_exit(code)
        except BaseException:
            self.stop()  # the task itself is being torn down: never leave the rank behind
            raise
        finally:
            for thread in readers:
                thread.join(timeout=TERMINATE_GRACE_SECONDS)
            self.done.set()
            sender.join()
        return code

    def stop(self) -> None:
        """SIGTERM to the rank's process group, SIGKILL after the grace period."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=TERMINATE_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc.pid, signal.SIGKILL)

    def _watch_abort(self) -> None:
        while not self.done.is_set():
            try:
                if self.task.aborted(wait=_ABORT_POLL_SECONDS):
                    self.stop()
                    return
            except (OSError, RendezvousError):
                if self.done.is_set():
                    return
                self.stop()  # the driver is gone: nobody will collect this rank's result
                return

    def _read(self, pipe, stream: int) -> None:
        fd = pipe.fileno()
        try:
            while True:
                data = os.read(fd, 64 * 1024)
                if not data:
                    return
                with self.lock:
                    self.pending.append((stream, data))
        except OSError:
            return
        finally:
            pipe.close()

    def _send_loop(self) -> None:
        while not self.done.wait(self.task.spec.output_interval):
            self._send()
        self._send()

    def _send(self) -> None:
        with self.lock:
            pieces, self.pending = self.pending, []
        batch: List[Tuple[int, bytes]] = []
        size = 0
        for stream, data in pieces:
            for start in range(0, len(data), _MAX_BATCH):
                piece = data[start : start + _MAX_BATCH]
                if size + len(piece) > _MAX_BATCH and batch:
                    self._put_batch(batch)
                    batch, size = [], 0
                batch.append((stream, piece))
                size += len(piece)
        if batch:
            self._put_batch(batch)

    def _put_batch(self, batch: List[Tuple[int, bytes]]) -> None:
        try:
            self.task.client.put(
                protocol.output_scope(self.rank, self.seq), protocol.OUTPUT_KEY, protocol.encode_output(batch)
            )
        except (OSError, RendezvousError):
            return  # the driver is gone; the watcher stops the rank
        self.seq += 1


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
