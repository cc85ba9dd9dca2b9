"""The ranks on this machine as processes: their environment, starting them, watching them, stopping them.

Every launch mode of ``hvdlite-run`` (and so ``python -m hvdlite.runner.local`` and ``hvdlite.run(fn)``)
runs its ranks through this module:

* :func:`build_rank_env` gives a rank the parent environment plus the ``HVDLITE_*`` variables (and Horovod's
  names for the placement ones);
* :func:`start_rank` starts one rank in its own session / process group and forwards every line it prints,
  prefixed with ``[<rank>]<stdout>: `` or ``[<rank>]<stderr>: ``, progress bars (``\\r`` updates) included
  (and, with an output folder, also keeps the rank's raw output in ``DIR/rank.<r>/stdout`` and
  ``DIR/rank.<r>/stderr``); the rules are in :mod:`hvdlite.runner.output`;
* :func:`run_ranks` supervises the ranks and stops every one as soon as one fails, when the timeout expires,
  or when the launcher itself gets SIGINT/SIGTERM/SIGHUP (:class:`SignalCatcher`), and reports the failing
  rank's code (128 + signal number for a rank killed by a signal, 124 on timeout).

Remote ranks (:mod:`hvdlite.runner.ssh`) and the elastic driver's workers (:mod:`hvdlite.runner.elastic`) are
:class:`RankProcess` es too. Code outside the launcher uses :func:`build_rank_env` through
:mod:`hvdlite.runner.api`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from hvdlite.common.topology import RankInfo
from hvdlite.runner.failure_summary import RECORD as RECENT_COLLECTIVES
from hvdlite.runner.lifeline import LIFELINE
from hvdlite.runner.output import pump, report

__all__ = [
    "RankInfo",
    "RankProcess",
    "JobOutcome",
    "SignalCatcher",
    "build_rank_env",
    "rank_output_folder",
    "start_rank",
    "terminate_group",
    "stop_ranks",
    "exit_code_from_returncode",
    "run_ranks",
    "report",
    "TIMEOUT_EXIT_CODE",
    "TERMINATE_GRACE_SECONDS",
]

#: Exit code of the starter when ``--timeout`` expires (as timeout(1)).
TIMEOUT_EXIT_CODE = 124
#: Time the ranks get between SIGTERM and SIGKILL when they are stopped.
TERMINATE_GRACE_SECONDS = 5.0
#: Time the other ranks get, after one failed, to report the failure themselves (their collectives fail
#: naming the failed rank) and exit before they are stopped.
PEER_REPORT_GRACE_SECONDS = 2.0
#: How often the supervisor checks the ranks.
_POLL_INTERVAL = 0.05


# ---------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------


def build_rank_env(
    info: RankInfo,
    *,
    rendezvous_addr: str,
    rendezvous_port: int,
    secret: bytes,
    job_id: str,
    base_env: Optional[Mapping[str, str]] = None,
) -> Dict[str, str]:
    """Environment of one rank: ``base_env`` (default ``os.environ``) plus

    ``HVDLITE_RANK``, ``HVDLITE_SIZE``, ``HVDLITE_LOCAL_RANK``,
    ``HVDLITE_LOCAL_SIZE``, ``HVDLITE_CROSS_RANK``, ``HVDLITE_CROSS_SIZE``,
    ``HVDLITE_HOSTNAME``, ``HVDLITE_RENDEZVOUS_ADDR``,
    ``HVDLITE_RENDEZVOUS_PORT``, ``HVDLITE_SECRET`` (hex), ``HVDLITE_JOB_ID``
    and ``PYTHONUNBUFFERED=1``; the seven placement variables also under
    Horovod's names (``HOROVOD_RANK``, ..., ``HOROVOD_HOSTNAME``, as
    ``horovodrun`` exports them), which scripts read before ``hvd.init()``,
    e.g. to pick a GPU.
    """
    env = dict(os.environ if base_env is None else base_env)
    placement = {
        "RANK": str(info.rank),
        "SIZE": str(info.size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_SIZE": str(info.local_size),
        "CROSS_RANK": str(info.cross_rank),
        "CROSS_SIZE": str(info.cross_size),
        "HOSTNAME": info.hostname,
    }
    for prefix in ("HVDLITE_", "HOROVOD_"):
        env.update((prefix + name, value) for name, value in placement.items())
    env.update(
        {
            "HVDLITE_RENDEZVOUS_ADDR": rendezvous_addr,
            "HVDLITE_RENDEZVOUS_PORT": str(rendezvous_port),
            "HVDLITE_SECRET": secret.hex(),
            "HVDLITE_JOB_ID": job_id,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


# ---------------------------------------------------------------------------
# Rank processes
# ---------------------------------------------------------------------------


class RankProcess:
    """A started rank: its :class:`subprocess.Popen` and output threads.

    The rank is the leader of its own process group (``pgid == pid``).
    :meth:`exited` checks for exit *without reaping* the process, so its
    process-group id stays reserved and the group can still be signalled
    safely (to clean up anything the rank left behind) until :meth:`reap`.
    """

    def __init__(self, rank: int, popen: subprocess.Popen, threads: Sequence[threading.Thread]) -> None:
        self.rank = rank
        self.popen = popen
        self.threads = list(threads)
        self._status: Optional[int] = None  # exit code once known

    def describe(self) -> str:
        """How the supervisor names this rank in its messages."""
        return "rank %d" % self.rank

    def explain_exit(self, code: int) -> str:
        """Extra words for a non-zero exit code ("" if none apply)."""
        return ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> Optional[int]:
        """Exit code (128+signum for a signal death) or None if running."""
        if self._status is not None:
            return self._status
        if self.popen.returncode is not None:
            self._status = exit_code_from_returncode(self.popen.returncode)
            return self._status
        if hasattr(os, "waitid"):
            try:
                info = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                # Already reaped elsewhere; Popen knows the status.
                self.popen.poll()
                if self.popen.returncode is not None:
                    self._status = exit_code_from_returncode(self.popen.returncode)
                return self._status
            if info is None:
                return None
            if info.si_code == os.CLD_EXITED:
                self._status = info.si_status
            else:  # CLD_KILLED / CLD_DUMPED
                self._status = 128 + info.si_status
            return self._status
        # No waitid (non-Linux): fall back to reaping.
        if self.popen.poll() is None:
            return None
        self._status = exit_code_from_returncode(self.popen.returncode)
        return self._status

    def stopped(self) -> bool:
        """True while the rank is stopped (SIGSTOP, Ctrl-Z, a debugger): it cannot report anything."""
        try:
            with open("/proc/%d/stat" % self.popen.pid) as f:
                return f.read().rsplit(") ", 1)[1][:1] in ("T", "t")
        except (OSError, IndexError):
            return False

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the rank's process group, ignoring if gone."""
        if self.popen.returncode is not None:
            return  # reaped: the pgid may no longer be ours to signal
        try:
            os.killpg(self.popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self) -> None:
        """Collect the (exited) leader and close its pipes."""
        self.popen.wait()
        LIFELINE.release(self.popen.pid)
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        if self._status is None:
            self._status = exit_code_from_returncode(self.popen.returncode)

    def join_output(self, timeout: float) -> None:
        """Wait up to ``timeout`` s in total for the output threads."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def exit_code_from_returncode(returncode: int) -> int:
    """Shell-style exit code: negative Popen codes become 128 + signum."""
    return 128 - returncode if returncode < 0 else returncode


def rank_output_folder(output_dir: str, rank: int, size: Optional[int]) -> str:
    """``output_dir/rank.<rank>``, the rank zero-padded to the width of the job's largest rank as horovodrun
    pads it (rank.03 of 12), so the folders sort in rank order."""
    width = len(str(size - 1)) if size and size > 1 else 1
    return os.path.join(output_dir, "rank.%0*d" % (width, rank))


def start_rank(
    rank: int,
    command: Sequence[str],
    env: Mapping[str, str],
    output_dir: Optional[str] = None,
    cwd: Optional[str] = None,
    stdin_data: Optional[bytes] = None,
    process_class: type = RankProcess,
    size: Optional[int] = None,
) -> RankProcess:
    """Start one rank in its own session and begin forwarding its output.

    With ``output_dir`` the rank's raw output is also written to
    ``output_dir/rank.<rank>/stdout`` and ``.../stderr`` (see :func:`rank_output_folder`; ``size`` is the
    job's number of ranks).  With
    ``stdin_data`` the rank's stdin is a pipe that gets these bytes and then
    stays open (the remote starter uses it as a lifeline); otherwise stdin is
    ``/dev/null``.  ``process_class`` (a :class:`RankProcess` subclass) wraps
    the started process.
    """
    log_dir = None
    if output_dir is not None:
        log_dir = rank_output_folder(output_dir, rank, size)
        os.makedirs(log_dir, exist_ok=True)
    popen = subprocess.Popen(
        list(command),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        close_fds=True,
        # Own session => own process group, and no controlling terminal:
        # the ranks never see the terminal's ^C; the starter stops them.
        start_new_session=True,
    )
    LIFELINE.watch(popen.pid)  # a session of its own: without this it would outlive a killed launcher
    if stdin_data is not None:
        try:
            popen.stdin.write(stdin_data)
            popen.stdin.flush()
        except BrokenPipeError:
            pass  # it exited already; the supervisor sees its exit code
    threads = []
    for name, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
        thread = threading.Thread(
            target=pump,
            name="hvdlite-rank%d-%s" % (rank, name),
            args=(pipe, rank, name, None if log_dir is None else os.path.join(log_dir, name)),
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    return process_class(rank, popen, threads)


def terminate_group(rank: RankProcess) -> None:
    """SIGTERM to the rank's process group, then SIGCONT: a stopped rank (SIGSTOP, a debugger's stop, Ctrl-Z)
    would otherwise hold the signal pending and sit out the whole grace period."""
    rank.signal_group(signal.SIGTERM)
    rank.signal_group(signal.SIGCONT)


def stop_ranks(
    ranks: Sequence[RankProcess], grace: float = TERMINATE_GRACE_SECONDS, hurry: Optional[Callable[[], bool]] = None
) -> None:
    """Stop every rank and everything in their process groups, then reap.

    Sends SIGTERM to the process group of each still-running rank, waits up
    to ``grace`` seconds (less if ``hurry()`` becomes true) and then sends
    SIGKILL to every rank's group, including ranks that already exited, so
    that no child they left behind survives the job.
    """
    running = [r for r in ranks if r.exited() is None]
    for rank in running:
        terminate_group(rank)
    deadline = time.monotonic() + grace
    while (
        any(r.exited() is None for r in running)
        and time.monotonic() < deadline
        and not (hurry is not None and hurry())
    ):
        time.sleep(_POLL_INTERVAL)
    for rank in ranks:
        rank.signal_group(signal.SIGKILL)
    for rank in ranks:
        rank.reap()


# ---------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------


class SignalCatcher:
    """Turn SIGINT/SIGTERM/SIGHUP into a flag while the job runs.

    The handler only records the signal; the supervisor loop acts on it.
    SIGHUP (the terminal was closed) matters because the ranks have their
    own sessions and never get it themselves; under ``nohup`` (SIGHUP
    ignored) it stays ignored. Handlers can only be installed from the main
    thread; elsewhere this is a no-op and the caller is responsible for
    stopping the job.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: List[int] = []
        self._previous: Dict[int, object] = {}

    def __enter__(self) -> "SignalCatcher":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                    continue
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            # getsignal() gives None for handlers not set from Python.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How a job ended: the exit code and, after a failure, the first rank
    that exited non-zero."""

    code: int
    failed_rank: Optional[int] = None


def _supervise(ranks: Sequence[RankProcess], timeout: Optional[float], signals: SignalCatcher) -> JobOutcome:
    """Wait for the ranks; stop them all on failure, timeout or signal."""
    started = time.monotonic()
    pending = list(ranks)
    while True:
        if signals.received:
            name = signal.Signals(signals.received[0]).name
            report("received %s; stopping all ranks" % name)
            stop_ranks(ranks, hurry=lambda: len(signals.received) > 1)
            return JobOutcome(128 + signals.received[0])
        if not pending:
            return JobOutcome(0)

        still_running = []
        for rank in pending:
            code = rank.exited()
            if code is None:
                still_running.append(rank)
            elif code != 0:
                # The others' collectives fail at once, naming the failed
                # rank: give them a moment to say so and exit by themselves,
                # then stop whoever is left (busy elsewhere, or stopped).
                others = [other for other in ranks if other is not rank]
                deadline = time.monotonic() + PEER_REPORT_GRACE_SECONDS
                while (
                    any(other.exited() is None and not other.stopped() for other in others)
                    and time.monotonic() < deadline
                    and not signals.received
                ):
                    time.sleep(_POLL_INTERVAL)
                for other in others:
                    if other.exited() is None:
                        terminate_group(other)
                rank.join_output(timeout=1.0)
                report(
                    "%s exited with code %d%s; stopping the other ranks"
                    % (rank.describe(), code, rank.explain_exit(code))
                )
                stop_ranks(ranks, hurry=lambda: bool(signals.received))
                return JobOutcome(code, rank.rank)
        pending = still_running

        if timeout is not None and time.monotonic() - started > timeout:
            report("job exceeded the timeout of %g s; stopping all ranks" % timeout)
            stop_ranks(ranks, hurry=lambda: bool(signals.received))
            return JobOutcome(TIMEOUT_EXIT_CODE)

        if pending:
            time.sleep(_POLL_INTERVAL)


def run_ranks(starters: Sequence[Callable[[], RankProcess]], timeout: Optional[float] = None) -> JobOutcome:
    """Start one rank per starter (in order), supervise them, clean up.

    Returns exit code 0 if every rank exited 0, the code of the first
    failing rank otherwise (128 + signum for a signal death), 124 if
    ``timeout`` seconds elapsed, or 128 + signum if this process got
    SIGINT/SIGTERM/SIGHUP.  Every rank (and every process in its process
    group) is gone when this returns, also when it raises (e.g.
    :class:`OSError` if a command cannot be executed).
    """
    if timeout is not None and timeout <= 0:
        raise ValueError("timeout must be positive, got %r" % timeout)
    ranks: List[RankProcess] = []
    completed = False
    RECENT_COLLECTIVES.clear()
    try:
        with SignalCatcher() as signals:
            for start in starters:
                if signals.received:
                    break  # _supervise() reports it and stops what started
                ranks.append(start())
            outcome = _supervise(ranks, timeout, signals)
            completed = True
    finally:
        # After a failure, timeout or signal everything is already stopped
        # and reaped.  After success this kills whatever the ranks left in
        # their process groups and reaps them.  After an exception (a rank
        # that could not be started, a bug) it stops the job without grace.
        stop_ranks(ranks, grace=TERMINATE_GRACE_SECONDS if completed else 0.0)
        for rank in ranks:
            rank.join_output(timeout=2.0)
    if outcome.code != 0:
        for line in RECENT_COLLECTIVES.summary(rank.rank for rank in ranks):
            report(line)
    return outcome
