"""horovodrun's tuning flags, in one table: each becomes an ``HVDLITE_*`` variable that every rank's core reads at
init (Horovod's ``HOROVOD_*`` name works too, set by hand). The flags hvdlite cannot honour are in a second table
with the reason, and fail with it instead of being ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Callable, Dict, Optional, Sequence, Tuple

#: Horovod's level names; hvdlite-run and the core take them in either case.
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


def _number(text: str, minimum: float = 0.0, strict: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if value < minimum or (strict and value == minimum):
        raise argparse.ArgumentTypeError("%s must be %s %g" % (text, "above" if strict else "at least", minimum))
    return value


def _plain(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def mebibytes(text: str) -> str:
    return str(int(_number(text) * 1024 * 1024))


def positive(text: str) -> str:
    return _plain(_number(text, strict=True))


def non_negative(text: str) -> str:
    return _plain(_number(text))


def count(text: str) -> str:
    value = _number(text)
    if not value.is_integer():
        raise argparse.ArgumentTypeError("%s is not a whole number" % text)
    return str(int(value))


def log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            "%r is not one of %s (either case)" % (text, ", ".join(level.upper() for level in LOG_LEVELS))
        )
    return text.lower()


def text(value: str) -> str:
    return value


@dataclasses.dataclass(frozen=True)
class KnobFlag:
    """A flag that sets variables for every rank: ``convert`` turns its argument into the value of each of
    ``variables``; a switch (``convert`` None) sets ``constant``."""

    flags: Tuple[str, ...]
    variables: Tuple[str, ...]
    help: str
    convert: Optional[Callable[[str], str]] = None
    constant: str = "1"
    metavar: Optional[str] = None

    @property
    def dest(self) -> str:
        # Flags that set the same variables share it, so the last one on the command line wins.
        return "knob_" + "_".join(self.variables).lower()


KNOB_FLAGS: Tuple[KnobFlag, ...] = (
    KnobFlag(
        ("--fusion-threshold-mb",),
        ("FUSION_THRESHOLD",),
        "fuse allreduces up to this many MiB (default 64)",
        mebibytes,
        metavar="MB",
    ),
    KnobFlag(
        ("--cycle-time-ms",), ("CYCLE_TIME",), "background cycle period in ms (default 1)", positive, metavar="MS"
    ),
    KnobFlag(
        ("--cache-capacity",),
        ("CACHE_CAPACITY",),
        "response cache entries; 0 turns the cache off (default 1024)",
        count,
        metavar="N",
    ),
    KnobFlag(
        ("--hierarchical-allreduce",),
        ("HIERARCHICAL_ALLREDUCE",),
        "reduce in two tiers (in each host, then across hosts) where ranks span hosts with several on each "
        "(the default)",
    ),
    KnobFlag(
        ("--no-hierarchical-allreduce",), ("HIERARCHICAL_ALLREDUCE",), "always the flat allreduce", constant="0"
    ),
    KnobFlag(
        ("--hierarchical-allgather",),
        ("HIERARCHICAL_ALLGATHER",),
        "gather in two tiers where ranks span hosts with several on each (the default)",
    ),
    KnobFlag(
        ("--no-hierarchical-allgather",), ("HIERARCHICAL_ALLGATHER",), "always the flat allgather", constant="0"
    ),
    KnobFlag(("--autotune",), ("AUTOTUNE",), "search the fusion threshold and cycle time while the job runs"),
    KnobFlag(
        ("--autotune-log-file",), ("AUTOTUNE_LOG",), "rank 0 writes each scored setting here", text, metavar="FILE"
    ),
    KnobFlag(
        ("--autotune-warmup-samples",),
        ("AUTOTUNE_WARMUP_WINDOWS",),
        "scoring windows left out before the search starts (hvdlite scores windows of allreduced bytes)",
        count,
        metavar="N",
    ),
    KnobFlag(
        ("--timeline-filename",), ("TIMELINE",), "rank 0 writes a Chrome-trace timeline to FILE", text, metavar="FILE"
    ),
    KnobFlag(("--timeline-mark-cycles",), ("TIMELINE_MARK_CYCLES",), "mark each background cycle in the timeline"),
    KnobFlag(("--no-stall-check",), ("STALL_CHECK_DISABLE",), "never warn about, or stop on, stalled tensors"),
    KnobFlag(
        ("--stall-check-warning-time-seconds",),
        ("STALL_CHECK_TIME_SECONDS",),
        "warn about a tensor some ranks have not submitted after this long (default 60)",
        non_negative,
        metavar="SECONDS",
    ),
    KnobFlag(
        ("--stall-check-shutdown-time-seconds",),
        ("STALL_SHUTDOWN_TIME_SECONDS",),
        "fail a tensor stalled this long (default: never)",
        non_negative,
        metavar="SECONDS",
    ),
    KnobFlag(
        ("--log-level",),
        ("LOG_LEVEL",),
        "log level of the ranks: TRACE, DEBUG, INFO, WARNING, ERROR, "
        "FATAL, either case (default WARNING); INFO shows each rank's bootstrap",
        log_level,
        metavar="LEVEL",
    ),
    KnobFlag(("--log-without-timestamp", "--log-hide-timestamp"), ("LOG_HIDE_TIME",), "log lines without their time"),
    KnobFlag(
        ("--tcp",),
        ("SHM_DISABLE", "CMA_DISABLE"),
        "move every byte over TCP, also between ranks of one host (no shared memory, no single copy)",
    ),
)

#: horovodrun flags that have no meaning here, and why. They fail at once rather than be silently dropped.
UNSUPPORTED_FLAGS: Dict[str, str] = {
    "--autotune-steps-per-sample": "hvdlite's autotuner scores windows of allreduced bytes, not of steps "
    "(HVDLITE_AUTOTUNE_WINDOW_BYTES sets their size)",
    "--autotune-bayes-opt-max-samples": "hvdlite's autotuner searches by successive halving, not Bayesian "
    "optimisation",
    "--autotune-gaussian-process-noise": "hvdlite's autotuner searches by successive halving, not Bayesian "
    "optimisation",
    "--mpi-threads-disable": "hvdlite calls MPI from its background thread only and asks MPI for the thread "
    "level that needs; there is no multi-threaded use to turn off",
    "--num-nccl-streams": "hvdlite's NCCL data plane has no setting for its number of streams",
    "--thread-affinity": "hvdlite does not pin its background thread to a core",
    "--jsrun": "IBM's jsrun (LSF) is not supported; use --mpi, or the built-in launcher with -H or --hostfile",
}


class _Unsupported(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        kwargs.update(nargs="?", default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("%s is not supported: %s" % (option_string, UNSUPPORTED_FLAGS[option_string]))


def add_to_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the knob flags (as a group) and the refused ones (hidden) to ``parser``."""
    group = parser.add_argument_group("tuning (passed to every rank as HVDLITE_* variables)")
    for knob in KNOB_FLAGS:
        names = ", ".join(
            "HVDLITE_%s=%s" % (v, knob.constant if knob.convert is None else "…") for v in knob.variables
        )
        if knob.convert is None:
            group.add_argument(
                *knob.flags,
                dest=knob.dest,
                action="store_const",
                const=knob.constant,
                default=None,
                help="%s (%s)" % (knob.help, names),
            )
        else:
            group.add_argument(
                *knob.flags,
                dest=knob.dest,
                type=knob.convert,
                default=None,
                metavar=knob.metavar,
                help="%s (%s)" % (knob.help, names),
            )
    for flag in UNSUPPORTED_FLAGS:
        parser.add_argument(flag, action=_Unsupported, help=argparse.SUPPRESS)


def knob_values(args: argparse.Namespace) -> Dict[str, str]:
    """``{HVDLITE_<variable>: value}`` for the knob flags given."""
    values: Dict[str, str] = {}
    for knob in KNOB_FLAGS:
        value = getattr(args, knob.dest, None)
        if value is not None:
            for variable in knob.variables:
                values["HVDLITE_" + variable] = value
    return values


def flags_for(variable: str) -> Sequence[str]:
    """The flags that set ``variable`` (for messages and docs)."""
    return [flag for knob in KNOB_FLAGS if variable in knob.variables for flag in knob.flags]
