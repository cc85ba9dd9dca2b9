"""What the user asked the launcher for (CLI flags or ``hvdlite.run`` arguments), and the environment it
implies for the ranks: tuning knobs as ``HVDLITE_*`` variables and which of the launcher's own variables
travel to other hosts."""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Mapping, Optional

from hvdlite.runner.hosts import HostSlots
from hvdlite.runner.ssh import SshOptions

DEFAULT_START_TIMEOUT = 60.0


@dataclasses.dataclass
class Settings:
    np: Optional[int] = None  # None: one rank per slot
    hosts: Optional[List[HostSlots]] = None  # None: all ranks on localhost
    start_timeout: float = DEFAULT_START_TIMEOUT
    network_interfaces: List[str] = dataclasses.field(default_factory=list)
    output_filename: Optional[str] = None
    verbose: bool = False
    knobs: Dict[str, str] = dataclasses.field(default_factory=dict)  # HVDLITE_* values of the tuning flags
    ssh: SshOptions = dataclasses.field(default_factory=SshOptions)
    timeout: Optional[float] = None  # stop the whole job after this many seconds
    mpi_args: List[str] = dataclasses.field(default_factory=list)
    binding_args: List[str] = dataclasses.field(default_factory=list)  # mpirun's binding; empty: its default
    prefix_timestamps: bool = False  # rank lines start with the time (horovodrun's --prefix-output-with-timestamp)
    max_restarts: int = 0  # how many times a failed job is started again
    host_ids: Optional[List[str]] = None  # --host-ids: one id per rank, all ranks here as hosts "host<id>"

    def host_list(self) -> List[HostSlots]:
        if self.hosts:
            return list(self.hosts)
        if self.np is None:
            raise ValueError("give -np, or hosts with -H/--hostfile")
        return [HostSlots("localhost", self.np)]

    def knob_env(self) -> Dict[str, str]:
        """The ``HVDLITE_*`` variables that carry the tuning flags (read by the core at init)."""
        env = {"HVDLITE_START_TIMEOUT": _number(self.start_timeout)}
        env.update(self.knobs)
        if self.network_interfaces:
            env["HVDLITE_NETWORK_INTERFACE"] = ",".join(self.network_interfaces)
        return env

    def validate(self) -> None:
        if self.np is not None and self.np < 1:
            raise ValueError("-np must be at least 1, got %d" % self.np)
        if self.np is None and not self.hosts:
            raise ValueError("give -np, or hosts with -H/--hostfile")
        if self.start_timeout <= 0:
            raise ValueError("--start-timeout must be positive")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError("--timeout must be positive")
        if self.max_restarts < 0:
            raise ValueError("--max-restarts must be at least 0, got %d" % self.max_restarts)
        if self.host_ids is not None:
            if self.hosts:
                raise ValueError("--host-ids emulates hosts on this machine; it cannot be used with -H/--hostfile")
            if len(self.host_ids) != self.np:
                raise ValueError("--host-ids has %d entries for -np %d" % (len(self.host_ids), self.np))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# Variables that describe the launcher's own login or terminal, not the job: another host keeps its own.
_HOST_SPECIFIC = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "MAIL",
        "HOSTNAME",
        "HOST",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "TERM",
        "TERMCAP",
        "COLUMNS",
        "LINES",
        "DISPLAY",
        "XAUTHORITY",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOW",
        "PS1",
        "PS2",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_RUNTIME_DIR",
        "XDG_SESSION_ID",
        "XDG_SESSION_TYPE",
        "XDG_SESSION_CLASS",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "SSH_TTY",
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "SSH_ORIGINAL_COMMAND",
    }
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def propagated_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """The part of the launcher's environment that remote ranks get: everything (PATH, PYTHONPATH, the
    user's own variables, as Horovod does) except what describes this login or terminal, exported shell
    functions and names a shell cannot export."""
    return {
        key: value
        for key, value in environ.items()
        if _NAME.match(key) and key not in _HOST_SPECIFIC and not key.startswith("BASH_FUNC_")
    }
