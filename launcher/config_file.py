"""``hvdlite-run --config-file FILE``: horovodrun's YAML of tuning settings, read as the flags it stands for.

Each setting becomes the command-line flag it mirrors, placed before the user's own arguments, so a flag given on
the command line wins (as in horovodrun) and every value is checked by the flag's own parser. Unlike horovodrun,
an unknown section or key is an error naming it, and a setting hvdlite cannot honour fails with the reason its
flag gives.

    controller: gloo            # or mpi (ignored when --gloo/--mpi is given)
    params: {fusion_threshold_mb: 32, cycle_time_ms: 5, cache_capacity: 2048,
             hierarchical_allreduce: true, hierarchical_allgather: false}
    autotune: {enabled: true, log_file: tune.csv, warmup_samples: 5}
    timeline: {filename: timeline.json, mark_cycles: true}
    stall_check: {enabled: true, warning_time_seconds: 120, shutdown_time_seconds: 240}
    library_options: {gloo_timeout_seconds: 60}
    logging: {level: INFO, hide_timestamp: false}
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import yaml

from hvdlite.runner.knob_flags import UNSUPPORTED_FLAGS


def _value(flag: str) -> Callable[[Any], List[str]]:
    return lambda value: [] if value is None else [flag, str(value)]


def _switch(on: str, off: Optional[str] = None) -> Callable[[Any], List[str]]:
    def convert(value: Any) -> List[str]:
        flag = on if _boolean(value) else off
        return [flag] if flag else []

    return convert


def _unsupported(flag: str) -> Callable[[Any], List[str]]:
    def convert(value: Any) -> List[str]:
        if value is None or value is False:
            return []  # turned off: nothing to honour
        raise ValueError(f"{flag} is not supported: {UNSUPPORTED_FLAGS[flag]}")

    return convert


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    if isinstance(value, int):
        return value != 0
    raise ValueError(f"{value!r} is not true or false")


#: section -> key -> the flags the setting stands for (horovodrun's sections and keys).
SETTINGS: Dict[str, Dict[str, Callable[[Any], List[str]]]] = {
    "params": {
        "fusion_threshold_mb": _value("--fusion-threshold-mb"),
        "cycle_time_ms": _value("--cycle-time-ms"),
        "cache_capacity": _value("--cache-capacity"),
        "hierarchical_allreduce": _switch("--hierarchical-allreduce", "--no-hierarchical-allreduce"),
        "hierarchical_allgather": _switch("--hierarchical-allgather", "--no-hierarchical-allgather"),
    },
    "autotune": {
        "enabled": _switch("--autotune"),
        "log_file": _value("--autotune-log-file"),
        "warmup_samples": _value("--autotune-warmup-samples"),
        "steps_per_sample": _unsupported("--autotune-steps-per-sample"),
        "bayes_opt_max_samples": _unsupported("--autotune-bayes-opt-max-samples"),
        "gaussian_process_noise": _unsupported("--autotune-gaussian-process-noise"),
    },
    "timeline": {
        "filename": _value("--timeline-filename"),
        "mark_cycles": _switch("--timeline-mark-cycles"),
    },
    "stall_check": {
        "enabled": lambda value: [] if value is None or _boolean(value) else ["--no-stall-check"],
        "warning_time_seconds": _value("--stall-check-warning-time-seconds"),
        "shutdown_time_seconds": _value("--stall-check-shutdown-time-seconds"),
    },
    "library_options": {
        "gloo_timeout_seconds": _value("--gloo-timeout-seconds"),
        "mpi_threads_disable": _unsupported("--mpi-threads-disable"),
        "num_nccl_streams": _unsupported("--num-nccl-streams"),
        "ccl_bgt_affinity": _unsupported("--thread-affinity"),
    },
    "logging": {
        "level": _value("--log-level"),
        "hide_timestamp": _switch("--log-without-timestamp"),
        "with_timestamp": lambda value: [] if value is None or _boolean(value) else ["--log-without-timestamp"],
    },
}


def read(path: str) -> Mapping[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except OSError as exc:
        raise ValueError(f"--config-file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--config-file {path} is not valid YAML: {exc}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"--config-file {path}: expected sections (a mapping), got {type(config).__name__}")
    return config


def to_arguments(config: Mapping[str, Any], path: str, controller_given: bool) -> List[str]:
    """The command-line arguments that ``config`` stands for (raises ValueError naming a bad entry)."""
    arguments: List[str] = []
    for section, entries in config.items():
        if section == "controller":
            if controller_given or entries is None:
                continue
            if str(entries).lower() not in ("gloo", "mpi"):
                raise ValueError(f"--config-file {path}: controller is {entries!r}; hvdlite-run takes gloo or mpi")
            arguments.append("--" + str(entries).lower())
            continue
        known = SETTINGS.get(section)
        if known is None:
            raise ValueError(
                f"--config-file {path}: unknown section {section!r}; the sections are controller, "
                + ", ".join(SETTINGS)
            )
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise ValueError(f"--config-file {path}: section {section!r} must hold key: value pairs")
        for key, value in entries.items():
            convert = known.get(key)
            if convert is None:
                raise ValueError(
                    f"--config-file {path}: unknown key {section}.{key}; {section} takes " + ", ".join(known)
                )
            try:
                arguments += convert(value)
            except ValueError as exc:
                raise ValueError(f"--config-file {path}: {section}.{key}: {exc}") from None
    return arguments


def expand(argv: Sequence[str], config_path: str, controller_given: bool) -> List[str]:
    """``argv`` with the config file's settings in front of it (the command line wins over them)."""
    return to_arguments(read(config_path), config_path, controller_given) + list(argv)
