"""Whole, tagged lines for ranks that mpirun starts: ``python -m hvdlite.runner.rank_lines COMMAND...``.

mpirun's own tagging (Open MPI's ``--tag-output``, MPICH's ``-prepend-rank``) tags each chunk it reads, so a
program that writes a line in pieces (Python with ``PYTHONUNBUFFERED=1`` writes ``print``'s text and its newline
separately) has its line cut and mixed with other ranks'. This wrapper runs the rank's command with pipes and
writes only whole lines, each with the rank's ``[<rank>]<stdout>: `` prefix, in one write: the same output as the
built-in launcher's. Unfinished text is written when the stream ends or once it reaches the line limit.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from typing import List, Optional, Sequence

from hvdlite.runner.output import LineSplitter, rank_prefix, timestamp_prefix

#: Where MPI implementations put the rank's number: Open MPI, PMIx, MPICH/Hydra (PMI).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def rank_from_environment(environ=None) -> int:
    environ = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    raise RuntimeError(
        "rank_lines: no rank in the environment (%s); it runs under mpirun" % ", ".join(RANK_VARIABLES)
    )


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def relay(command: Sequence[str], rank: int, timestamps: bool = False) -> int:
    """Runs ``command``; returns its exit code (128 + signal when a signal ended it, as a shell reports)."""
    child = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # mpirun stops a job by signalling the processes it started, which are these wrappers: pass it on.
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, lambda signum, _frame: child.send_signal(signum))
    streams = {
        child.stdout.fileno(): ("stdout", sys.stdout.fileno()),
        child.stderr.fileno(): ("stderr", sys.stderr.fileno()),
    }
    splitters = {fd: LineSplitter() for fd in streams}
    selector = selectors.DefaultSelector()
    for fd in streams:
        selector.register(fd, selectors.EVENT_READ)
    while streams:
        for key, _ in selector.select():
            fd = key.fd
            name, out = streams[fd]
            data = os.read(fd, 65536)
            events = splitters[fd].feed(data) if data else splitters[fd].close()
            prefix = timestamp_prefix(timestamps) + rank_prefix((rank, name))
            lines: List[bytes] = [prefix + e.content + b"\n" for e in events if e.finished]
            if lines:
                _write_all(out, b"".join(lines))
            if not data:
                selector.unregister(fd)
                del streams[fd]
    code = child.wait()
    return 128 - code if code < 0 else code


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    timestamps = argv[:1] == ["--timestamps"]
    if timestamps:
        argv = argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m hvdlite.runner.rank_lines [--timestamps] [--] COMMAND [ARG...]", file=sys.stderr)
        return 2
    return relay(argv, rank_from_environment(), timestamps)


if __name__ == "__main__":
    sys.exit(main())
