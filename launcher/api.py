"""The launcher's public API: the one module of ``hvdlite.runner`` that code outside the launcher imports.

``hvdlite.run`` (hvdlite/__init__.py), ``hvdlite.spark`` and ``hvdlite.ray`` run jobs of their own (Spark tasks
and Ray actors as ranks) with the launcher's pieces; they take those pieces from here and only from here
(``tests/test_layering.py`` checks it), so the rest of ``hvdlite.runner`` can change without breaking them, and
the launcher and the library do not depend on each other's insides. What this module offers:

- ``run(fn, ...)``: ``hvdlite.run``, Horovod's ``horovod.run``: run a Python function on every rank of a job and
  collect the results, and :class:`RunError`, what it (and ``hvdlite.spark.run``, ``hvdlite.ray``) raises when a
  rank fails;
- :func:`build_rank_env`: a rank's environment (the ``HVDLITE_*`` and ``HOROVOD_*`` variables a rank reads);
- shipping a function to the ranks and its results back over the job's rendezvous service (protocol in
  run_task.py): :data:`RUN_SCOPE`, :func:`pack_call`, :func:`put_blob`, :func:`get_blob`, and
  :func:`run_rank_function`, the rank's side;
- the rules for the ranks' output lines (output.py): :class:`LineSplitter` (a stream's bytes to line events),
  :class:`LineSink` (writes them, thinning progress updates), :func:`progress_interval`, :func:`rank_prefix`,
  :func:`timestamp_prefix`.

``run(fn)`` itself: the function, its arguments and the results travel through the job's rendezvous service, so
remote hosts need the same Python environment but no shared filesystem. ``fn`` calls ``hvd.init()`` itself, like
a training script.
"""

from __future__ import annotations

import signal
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from hvdlite.runner.hosts import parse_hostfile, parse_hosts
from hvdlite.runner.output import LineSink, LineSplitter, progress_interval, rank_prefix, timestamp_prefix
from hvdlite.runner.processes import build_rank_env
from hvdlite.runner.run_task import SCOPE as RUN_SCOPE
from hvdlite.runner.run_task import get_blob, pack_call, put_blob
from hvdlite.runner.run_task import main as run_rank_function
from hvdlite.runner.settings import DEFAULT_START_TIMEOUT, Settings
from hvdlite.runner.ssh import SshOptions

__all__ = [
    "run",
    "RunError",
    "build_rank_env",
    "RUN_SCOPE",
    "pack_call",
    "put_blob",
    "get_blob",
    "run_rank_function",
    "LineSplitter",
    "LineSink",
    "progress_interval",
    "rank_prefix",
    "timestamp_prefix",
]


class RunError(RuntimeError):
    """A rank failed. ``rank``: the first rank that failed; ``exit_code``; ``remote_traceback``: its Python
    traceback text, if it raised."""

    def __init__(self, message: str, rank: Optional[int], exit_code: int, remote_traceback: Optional[str]):
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
        self.remote_traceback = remote_traceback


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    np: int = 2,
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    start_timeout: Optional[float] = None,
    ssh_port: Optional[int] = None,
    ssh_identity_file: Optional[str] = None,
    ssh_options: Sequence[str] = (),
    output_filename: Optional[str] = None,
    verbose: bool = False,
    network_interface: Optional[str] = None,
    executable: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    num_proc: Optional[int] = None,
) -> List[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``np`` ranks and returns the results in rank order.

    ``hosts`` is ``"host1:2,host2:2"`` (default: all on this machine) or ``hostfile`` a file of
    ``host slots=N`` lines; remote ranks start over ssh (``ssh_port``, ``ssh_identity_file``, ``ssh_options``
    as "Key=Value"). ``env`` adds variables for the ranks; ``executable`` is their Python (default: this one).
    ``timeout`` stops the job after that many seconds. The ranks' output is forwarded with rank prefixes.

    Raises :class:`RunError` with the failing rank's traceback when a rank fails, KeyboardInterrupt when
    interrupted (every rank is stopped first).
    """
    import cloudpickle

    from hvdlite.runner.job import BuiltinJob

    if hosts is not None and hostfile is not None:
        raise ValueError("give hosts or hostfile, not both")
    if num_proc is not None:  # horovod.run's name for np
        np = num_proc
    settings = Settings(
        np=np,
        hosts=parse_hosts(hosts) if hosts else parse_hostfile(hostfile) if hostfile else None,
        start_timeout=start_timeout or DEFAULT_START_TIMEOUT,
        timeout=timeout,
        verbose=verbose,
        output_filename=output_filename,
        network_interfaces=[nic for nic in (network_interface or "").split(",") if nic],
        ssh=SshOptions(port=ssh_port, identity_file=ssh_identity_file, options=list(ssh_options)),
    )
    payload = pack_call(fn, args, kwargs)
    command = [executable or sys.executable, "-m", "hvdlite.runner.run_task"]
    with BuiltinJob(settings, command, extra_env=env) as job:
        client = job.client()
        put_blob(client, "fn", payload)
        outcome = job.run()
        size = len(job.assignment)
        results: Dict[int, tuple] = {}
        for rank in range(size):
            try:
                results[rank] = cloudpickle.loads(get_blob(client, f"result.{rank}", wait=0))
            except TimeoutError:
                pass  # the rank died (or was stopped) before storing anything
    if outcome.code == 128 + signal.SIGINT:
        raise KeyboardInterrupt
    if outcome.code != 0:
        raise _failure(outcome.code, outcome.failed_rank, results)
    return [results[rank][1] for rank in range(size)]


def _failure(code: int, rank: Optional[int], results: Dict[int, tuple]) -> RunError:
    if rank is None:
        return RunError(f"hvdlite.run: the job was stopped (exit code {code})", None, code, None)
    stored = results.get(rank)
    if stored is not None and stored[0] == "error":
        return RunError(f"hvdlite.run: rank {rank} failed:\n{stored[1]}", rank, code, stored[1])
    return RunError(
        f"hvdlite.run: rank {rank} exited with code {code} without a Python exception (killed, or "
        "it crashed); see its output above",
        rank,
        code,
        None,
    )
