"""``hvdlite-run``'s command line: Horovod's ``horovodrun`` flags, parsed into the launcher's Settings.

build_parser() is the one parser (launch.py's main, local.py's alias and docs/knobs.md's generator use it);
settings_from_args turns what it parsed into Settings, with a message for the user where the flags do not fit.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable, List

from hvdlite.runner import knob_flags
from hvdlite.runner.hosts import parse_host_ids, parse_hostfile, parse_hosts
from hvdlite.runner.settings import DEFAULT_START_TIMEOUT, Settings
from hvdlite.runner.ssh import SshOptions


def _default_start_timeout() -> float:
    for name in ("HVDLITE_START_TIMEOUT", "HOROVOD_START_TIMEOUT"):
        if os.environ.get(name):
            try:
                return float(os.environ[name])
            except ValueError:
                pass
    return DEFAULT_START_TIMEOUT


def _whole_number(minimum: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a whole number" % text) from None
        if value < minimum:
            raise argparse.ArgumentTypeError("%d must be at least %d" % (value, minimum))
        return value

    return convert


def build_parser() -> argparse.ArgumentParser:
    import hvdlite
    from hvdlite.common import checkpoint

    parser = argparse.ArgumentParser(
        prog="hvdlite-run",
        allow_abbrev=False,
        description="Run an hvdlite (Horovod-compatible) training job: one process per rank, on this machine "
        "and on other hosts over ssh, or through mpirun with --mpi.",
        usage="%(prog)s [-np NP] [-H HOSTS | --hostfile FILE] [options] command [args ...]",
    )
    parser.add_argument("-v", "--version", action="version", version="hvdlite %s" % hvdlite.__version__)
    parser.add_argument(
        "-np",
        "--num-proc",
        dest="np",
        type=int,
        default=None,
        help="number of ranks (default: one per slot of the hosts)",
    )
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument(
        "-H",
        "--hosts",
        default=None,
        metavar="HOSTS",
        help="hosts and slots, e.g. node1:4,node2:4 (default: localhost with NP slots); "
        "[user@]host, IPv6 addresses in brackets",
    )
    hosts.add_argument(
        "-hostfile", "--hostfile", default=None, metavar="FILE", help="file with one host per line: 'host slots=N'"
    )
    # A testing aid, not in --help: this machine pretends to be several hosts, rank r on "host<id_r>" (local and
    # cross ranks as on that many hosts). python -m hvdlite.runner.local documents it.
    parser.add_argument("--host-ids", type=parse_host_ids, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--start-timeout",
        "--gloo-timeout-seconds",
        dest="start_timeout",
        type=float,
        default=_default_start_timeout(),
        metavar="SECONDS",
        help="how long ranks wait for each other at init, and ssh for a connection "
        "(default: $HVDLITE_START_TIMEOUT or %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop the whole job after this many seconds and exit 124 (default: no limit)",
    )
    parser.add_argument(
        "--network-interface",
        "--network-interfaces",
        dest="nics",
        action="append",
        default=[],
        metavar="NICS",
        help="interfaces to use between hosts (e.g. eth0), comma-separated or repeated; each rank "
        "advertises the address of the first one it has",
    )
    parser.add_argument(
        "--output-filename",
        default=None,
        metavar="DIR",
        help="also keep each rank's raw output (as it wrote it) in DIR/rank.<r>/stdout and stderr, "
        "<r> zero-padded to the width of the largest rank",
    )
    parser.add_argument(
        "--config-file",
        default=None,
        metavar="FILE",
        help="horovodrun's YAML of tuning settings (params, autotune, timeline, stall_check, "
        "library_options, logging, controller); flags on the command line win over it",
    )
    parser.add_argument(
        "--prefix-output-with-timestamp",
        "-prefix-timestamp",
        action="store_true",
        help="start each line of the ranks' output with the time it was printed",
    )
    parser.add_argument(
        "--disable-cache",
        action="store_true",
        help="run the launcher's checks of the hosts every time: hvdlite-run always does, as "
        "horovodrun does with this flag (hvdlite keeps no such cache)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="say what the launcher does: rendezvous address, where each rank runs, ssh",
    )
    parser.add_argument(
        "-cb",
        "--check-build",
        action="store_true",
        help="show which frameworks and backends this installation has, and exit",
    )

    knob_flags.add_to_parser(parser)

    ssh = parser.add_argument_group("ssh (remote hosts)")
    ssh.add_argument("-p", "--ssh-port", type=int, default=None, help="ssh port on every remote host")
    ssh.add_argument("-i", "--ssh-identity-file", default=None, metavar="FILE", help="ssh private key")
    ssh.add_argument("--ssh-config-file", default=None, metavar="FILE", help="ssh client config file (ssh -F)")
    ssh.add_argument(
        "--ssh-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra ssh option (ssh -o), repeatable, e.g. StrictHostKeyChecking=accept-new",
    )

    mode = parser.add_argument_group("launch mode")
    exclusive = mode.add_mutually_exclusive_group()
    exclusive.add_argument("--mpi", action="store_true", help="hand the job to mpirun (Open MPI or MPICH)")
    exclusive.add_argument(
        "--gloo",
        "--builtin",
        dest="builtin",
        action="store_true",
        help="built-in launcher: rendezvous service, local processes and ssh (default)",
    )
    mode.add_argument("--mpi-args", default="", metavar="ARGS", help="extra arguments for mpirun (with --mpi)")
    mode.add_argument(
        "--binding-args",
        default="",
        metavar="ARGS",
        help="mpirun's process binding (with --mpi), instead of Open MPI's '--bind-to none --map-by "
        "slot' (which leaves the background thread free of the compute threads' core)",
    )

    elastic = parser.add_argument_group(
        "elastic training", "workers may be lost or added while the job runs (hvd.elastic in the script)"
    )
    elastic.add_argument(
        "--host-discovery-script",
        default=None,
        metavar="SCRIPT",
        help="program printing the usable hosts, one 'host' or 'host:slots' per line; turns on elastic mode",
    )
    elastic.add_argument(
        "--min-np",
        "--min-num-proc",
        dest="min_np",
        type=int,
        default=None,
        metavar="N",
        help="the job stops when fewer workers than this can continue (default: -np)",
    )
    elastic.add_argument(
        "--max-np",
        "--max-num-proc",
        dest="max_np",
        type=int,
        default=None,
        metavar="N",
        help="never more workers than this (default: -np)",
    )
    elastic.add_argument(
        "--slots-per-host",
        "--slots",
        dest="slots_per_host",
        type=int,
        default=1,
        metavar="N",
        help="slots of a host the discovery script prints without ':slots' (default: 1)",
    )
    elastic.add_argument(
        "--blacklist-cooldown-range",
        type=float,
        nargs=2,
        default=None,
        metavar=("LOW", "HIGH"),
        help="a host whose worker failed may be used again after a time drawn from "
        "[LOW, HIGH] seconds (default: never)",
    )
    elastic.add_argument(
        "--discovery-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often the discovery script runs (default: %(default)s)",
    )
    elastic.add_argument(
        "--elastic-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long the job waits for --min-np workers after it lost some, and how long a "
        "worker waits to be placed in a round (HVDLITE_ELASTIC_TIMEOUT; default: "
        "--start-timeout for the job, 600 s for a worker)",
    )
    elastic.add_argument(
        "--reset-limit",
        type=int,
        default=None,
        metavar="N",
        help="stop the job rather than re-form it an (N+1)th time (default: no limit)",
    )

    durable = parser.add_argument_group(
        "checkpoints and restarts", "hvd.elastic's state kept on disk, and a failed job started again from it"
    )
    durable.add_argument(
        "--checkpoint-dir",
        default=None,
        metavar="DIR",
        help="rank 0 also writes the state of hvd.elastic.run to DIR at commits, and the job "
        "resumes from the newest complete file when it starts again; DIR is read and "
        "written on rank 0's host only (HVDLITE_CHECKPOINT_DIR)",
    )
    durable.add_argument(
        "--checkpoint-every",
        type=_whole_number(1),
        default=None,
        metavar="N",
        help="write every N-th commit (HVDLITE_CHECKPOINT_EVERY; default %d)" % checkpoint.EVERY_DEFAULT,
    )
    durable.add_argument(
        "--checkpoint-keep",
        type=_whole_number(1),
        default=None,
        metavar="K",
        help="keep the newest K checkpoints, delete older ones (HVDLITE_CHECKPOINT_KEEP; "
        "default %d)" % checkpoint.KEEP_DEFAULT,
    )
    durable.add_argument(
        "--max-restarts",
        type=_whole_number(0),
        default=0,
        metavar="K",
        help="start a failed job again, up to K times; its ranks read the attempt in "
        "HVDLITE_RESTART_COUNT. Not after the launcher got SIGINT/SIGTERM/SIGHUP, nor "
        "after --timeout or --start-timeout (default: %(default)s)",
    )

    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs")
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Raises ValueError (or OSError for an unreadable hostfile) with a message for the user."""
    import shlex

    hosts = None
    if args.hosts is not None:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile is not None:
        hosts = parse_hostfile(args.hostfile)
    settings = Settings(
        np=args.np,
        hosts=hosts,
        start_timeout=args.start_timeout,
        timeout=args.timeout,
        network_interfaces=[nic.strip() for value in args.nics for nic in value.split(",") if nic.strip()],
        output_filename=args.output_filename,
        verbose=args.verbose,
        knobs=_knobs(args),
        ssh=SshOptions(
            port=args.ssh_port,
            identity_file=args.ssh_identity_file,
            config_file=args.ssh_config_file,
            options=list(args.ssh_option),
        ),
        mpi_args=shlex.split(args.mpi_args),
        binding_args=shlex.split(args.binding_args),
        prefix_timestamps=args.prefix_output_with_timestamp,
        max_restarts=args.max_restarts,
        host_ids=getattr(args, "host_ids", None),
    )
    settings.validate()
    return settings


def _knobs(args: argparse.Namespace) -> dict:
    knobs = knob_flags.knob_values(args)
    if getattr(args, "elastic_timeout", None) is not None:  # the workers' wait for a round (hvd.elastic)
        knobs["HVDLITE_ELASTIC_TIMEOUT"] = repr(float(args.elastic_timeout))
    if getattr(args, "checkpoint_dir", None):  # read by hvd.elastic.run on rank 0
        # Absolute: a script that changes its directory before hvd.elastic.run still writes where the user meant.
        knobs["HVDLITE_CHECKPOINT_DIR"] = os.path.abspath(os.path.expanduser(args.checkpoint_dir))
        for name in ("every", "keep"):
            value = getattr(args, "checkpoint_" + name)
            if value is not None:
                knobs["HVDLITE_CHECKPOINT_" + name.upper()] = str(value)
    elif getattr(args, "checkpoint_every", None) is not None or getattr(args, "checkpoint_keep", None) is not None:
        raise ValueError("--checkpoint-every and --checkpoint-keep need --checkpoint-dir")
    return knobs


def command_of(args: argparse.Namespace) -> List[str]:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    return command
