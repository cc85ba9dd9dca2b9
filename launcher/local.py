"""The short command line for a job on this machine, kept for its users and the tests.

Usage::

    python -m hvdlite.runner.local -np N [--host-ids 0,0,1,1] \\
        [--timeout SECONDS] [--output-filename DIR] -- command args...

It is an alias of ``hvdlite-run -np N [--host-ids ...] [--timeout S] [--output-filename DIR] -- command``: it
parses and checks its own flags (its usage, messages and ``-np`` being required stay as they were) and then
runs :func:`hvdlite.runner.launch.main` with them, so both command lines start, forward and stop the ranks
through the same code and end with the same exit codes: the failing rank's (128 + signal number for a rank
killed by a signal), 124 on ``--timeout``, 128 + signal number when the launcher gets SIGINT/SIGTERM/SIGHUP,
127 when the command cannot be started, 2 for bad flags.

``--host-ids`` lets a single machine pretend to be several hosts: ranks with the same id form one "host"
(``HVDLITE_HOSTNAME=host<id>``), which sets the local and cross ranks exactly as a multi-host launch would
(:func:`hvdlite.runner.hosts.emulated_hosts`; hidden from ``hvdlite-run --help``, where it is only a testing aid).

What the ranks get and how their output is forwarded: :mod:`hvdlite.runner.processes` and
:mod:`hvdlite.runner.output`.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from hvdlite.runner import launch
from hvdlite.runner.hosts import parse_host_ids

__all__ = ["main", "hvdlite_run_argv"]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hvdlite.runner.local",
        description="Run an hvdlite job as N processes on this machine.",
        usage="%(prog)s -np N [--host-ids IDS] [--timeout SECONDS] [--output-filename DIR] -- command [args ...]",
    )
    parser.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks to start")
    parser.add_argument(
        "--host-ids",
        type=parse_host_ids,
        default=None,
        help="comma-separated host id per rank, e.g. 0,0,1,1, to emulate several hosts (default: one host)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop the job and exit 124 after this many seconds (default: no limit)",
    )
    parser.add_argument(
        "--output-filename",
        default=None,
        metavar="DIR",
        help="also keep each rank's raw output in DIR/rank.<r>/stdout and DIR/rank.<r>/stderr",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs (after --)")
    return parser


def hvdlite_run_argv(args: argparse.Namespace, command: Sequence[str]) -> List[str]:
    """The ``hvdlite-run`` arguments that mean what this command line's parsed ``args`` and ``command`` mean.
    Values are attached with ``=``, so one that starts with ``-`` stays a value."""
    argv = ["-np", str(args.np)]
    if args.host_ids is not None:
        argv.append("--host-ids=" + ",".join(args.host_ids))
    if args.timeout is not None:
        argv.append("--timeout=%r" % args.timeout)
    if args.output_filename is not None:
        argv.append("--output-filename=" + args.output_filename)
    return argv + ["--"] + list(command)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" is the command, verbatim.
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
    else:
        options, command = argv, []
    parser = _build_parser()
    args = parser.parse_args(options)
    command = command or args.command
    if not command:
        parser.error("no command given (put it after --)")
    if args.np < 1:
        parser.error("-np must be at least 1")
    if args.host_ids is not None and len(args.host_ids) != args.np:
        parser.error("--host-ids has %d entries for -np %d" % (len(args.host_ids), args.np))
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be positive")
    return launch.main(hvdlite_run_argv(args, command))


if __name__ == "__main__":
    sys.exit(main())
