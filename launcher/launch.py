"""``hvdlite-run``: start an hvdlite job on one or more hosts (Horovod's ``horovodrun`` flags).

    hvdlite-run -np 4 python train.py                          # 4 ranks here
    hvdlite-run -np 8 -H node1:4,node2:4 python train.py       # 2 hosts over ssh
    hvdlite-run -np 8 --hostfile hosts.txt python train.py     # "node1 slots=4" per line
    hvdlite-run --mpi -np 8 -H node1:4,node2:4 python train.py # hand the job to mpirun
    hvdlite-run --check-build

The built-in mode is described in docs/launcher.md; the modules behind it: arguments (the flags), hosts (-H,
--hostfile), job (the rendezvous service and the ranks), ssh (remote ranks), processes (local processes,
teardown), output (the ranks' lines), mpi_run (--mpi), elastic (--host-discovery-script).

This is the launcher's one command line: ``python -m hvdlite.runner`` is this, and ``python -m
hvdlite.runner.local -np N [--host-ids ...] -- command`` (local.py) only translates its flags into this one's.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from hvdlite.runner.arguments import build_parser, command_of, settings_from_args
from hvdlite.runner.settings import Settings

#: Exit code when the job could not be started as asked (bad hosts, no route, no mpirun...).
LAUNCH_ERROR_EXIT_CODE = 2
COMMAND_NOT_FOUND_EXIT_CODE = 127


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``hvdlite-run``; returns the exit code (the first failing rank's)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.config_file:
        from hvdlite.runner import config_file

        try:
            argv = config_file.expand(argv, args.config_file, controller_given=args.mpi or args.builtin)
        except ValueError as exc:
            parser.error(str(exc))
        args = parser.parse_args(argv)
    if args.check_build:
        from hvdlite.runner.check_build import report as build_report

        print(build_report())
        return 0
    command = command_of(args)
    if not command:
        parser.error("no command given, e.g. hvdlite-run -np 2 python train.py")
    try:
        settings = settings_from_args(args)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))

    from hvdlite.runner.output import ROUTER, report

    ROUTER.timestamps = settings.prefix_timestamps
    if settings.host_ids is not None and (args.mpi or args.host_discovery_script):
        parser.error(
            "--host-ids emulates hosts with the built-in launcher; it cannot be used with --mpi or "
            "--host-discovery-script"
        )
    if args.binding_args and not args.mpi:
        report("--binding-args applies to mpirun (--mpi) only; the built-in launcher does not bind ranks")
    if args.mpi and settings.max_restarts:
        parser.error("--max-restarts needs the built-in launcher: with --mpi, mpirun replaces hvdlite-run")
    if args.mpi:
        from hvdlite.runner.mpi_run import MpiError, exec_mpirun

        try:
            exec_mpirun(settings, command)  # returns only on failure
        except (MpiError, OSError) as exc:
            report(str(exc))
            return LAUNCH_ERROR_EXIT_CODE
    if args.host_discovery_script:
        return _run_elastic(args, settings, command, parser)
    from hvdlite.runner.job import LaunchError, run_command

    try:
        return run_command(settings, command).code
    except LaunchError as exc:
        report(str(exc))
        return LAUNCH_ERROR_EXIT_CODE
    except OSError as exc:
        report("failed to start %r: %s" % (command[0], exc))
        return COMMAND_NOT_FOUND_EXIT_CODE


def _run_elastic(
    args: argparse.Namespace, settings: Settings, command: List[str], parser: argparse.ArgumentParser
) -> int:
    from hvdlite.runner.elastic import ElasticDriver, ElasticSettings
    from hvdlite.runner.output import report

    if args.np is None:
        parser.error("elastic mode needs -np (the number of workers to start with)")
    if args.mpi or args.hosts or args.hostfile:
        parser.error("--host-discovery-script replaces -H/--hostfile and cannot be used with --mpi")
    elastic = ElasticSettings(
        min_np=args.min_np or args.np,
        max_np=args.max_np or args.np,
        discovery_script=args.host_discovery_script,
        discovery_interval=args.discovery_interval,
        cooldown_range=tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None,
        slots_per_host=args.slots_per_host,
        elastic_timeout=args.elastic_timeout,
        reset_limit=args.reset_limit,
    )
    try:
        elastic.validate(args.np)
    except ValueError as exc:
        parser.error(str(exc))
    from hvdlite.runner.job import run_restarting

    try:
        return run_restarting(settings, lambda attempt: (ElasticDriver(attempt, elastic, command).run(), None)).code
    except (RuntimeError, OSError, ValueError) as exc:
        report(f"elastic job failed: {exc}")
        return LAUNCH_ERROR_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
