"""``hvdlite-run --mpi``: hand the job to ``mpirun``.

mpirun starts the ranks (locally and over its own ssh/PMI machinery), prefixes their output and tears the job
down on failure; inside each rank ``hvd.init()`` sees the MPI environment and bootstraps through mpi4py
(hvdlite/common/mpi_bootstrap.py). Open MPI and MPICH-derived (Hydra) ``mpirun`` are supported.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from hvdlite.runner.hosts import to_mpi_hosts
from hvdlite.runner.settings import Settings, propagated_environment
from hvdlite.runner.ssh import ssh_option_args

OPEN_MPI, MPICH = "openmpi", "mpich"

# Set by a launcher for its own ranks: a rank started by mpirun must not inherit them, or it would look for
# a rendezvous service that is not there instead of bootstrapping through MPI (and the HOROVOD_ copies of the
# placement would describe another job).
_PLACEMENT = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
LAUNCHER_VARIABLES = frozenset(
    ["HVDLITE_" + name for name in _PLACEMENT + ("RENDEZVOUS_ADDR", "RENDEZVOUS_PORT", "SECRET", "JOB_ID")]
    + ["HOROVOD_" + name for name in _PLACEMENT]
)
# Variables an MPI runtime sets for its own processes; passing the launcher's copies on would confuse it.
_MPI_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_", "PMI_", "HYDRA_", "MPIR_")


class MpiError(RuntimeError):
    pass


def find_mpirun(name: str = "mpirun") -> str:
    path = shutil.which(name)
    if path is None:
        raise MpiError(
            "%s not found on PATH: install Open MPI (e.g. apt-get install openmpi-bin) or MPICH, "
            "or drop --mpi to use hvdlite-run's built-in launcher" % name
        )
    return path


def implementation(mpirun: str) -> str:
    """Which MPI an ``mpirun`` belongs to, from its ``--version`` text."""
    try:
        out = subprocess.run(
            [mpirun, "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpiError("cannot run %s --version: %s" % (mpirun, exc)) from None
    text = out.stdout + out.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return OPEN_MPI
    if "HYDRA" in text or "Intel(R) MPI" in text or "MPICH" in text:
        return MPICH
    raise MpiError(
        "%s is neither Open MPI nor MPICH/Hydra (--version said: %s)" % (mpirun, text.strip().splitlines()[:1])
    )


def mpi_data_plane() -> Optional[str]:
    """None when this installation can move tensors through MPI, else why not."""
    from hvdlite.common.build_queries import mpi_facts

    info = mpi_facts()
    return None if info.get("mpi") == "1" else info.get("mpi_missing", "no MPI plugin")


def rank_environment(settings: Settings, environ: Mapping[str, str]) -> Dict[str, str]:
    """mpirun's environment, which it passes on to the ranks: ours and the tuning knobs, without launcher or
    MPI runtime variables. Host tensors go through MPI (HVDLITE_CPU_OPERATIONS=mpi) unless the user chose a
    backend."""
    env = {
        key: value
        for key, value in environ.items()
        if key not in LAUNCHER_VARIABLES and not key.startswith(_MPI_PREFIXES)
    }
    env.update(settings.knob_env())
    if "HVDLITE_CPU_OPERATIONS" not in env and "HOROVOD_CPU_OPERATIONS" not in env:
        env["HVDLITE_CPU_OPERATIONS"] = "mpi"
    return env


def mpirun_command(
    settings: Settings,
    command: Sequence[str],
    env: Mapping[str, str],
    mpirun: str,
    impl: str,
    is_root: Optional[bool] = None,
) -> List[str]:
    """The mpirun command line for ``command`` (``env`` as returned by :func:`rank_environment`)."""
    hosts = settings.host_list()
    np = settings.np if settings.np is not None else sum(host.slots for host in hosts)
    if impl == OPEN_MPI:
        cmd = [mpirun]
        if os.geteuid() == 0 if is_root is None else is_root:
            cmd.append("--allow-run-as-root")  # Open MPI refuses root otherwise (containers run as root)
        # Ranks fill hosts in order as in the built-in mode; binding would pin every rank's threads to one
        # core, which the core's background thread and the framework's threads share badly.
        cmd += [
            "-np",
            str(np),
            "-H",
            to_mpi_hosts(hosts),
            *(settings.binding_args or ["--bind-to", "none", "--map-by", "slot"]),
        ]
        ssh_args = ssh_option_args(settings.ssh)
        cmd += ["-mca", "plm_rsh_args", " ".join(ssh_args)]
        if settings.network_interfaces:
            nics = ",".join(settings.network_interfaces)
            cmd += ["-mca", "btl_tcp_if_include", nics, "-mca", "oob_tcp_if_include", nics]
        if settings.output_filename:
            cmd += ["--output-filename", settings.output_filename]
        # Open MPI passes only the variables named with -x to ranks on other hosts.
        for key in sorted(propagated_environment(env)):
            cmd += ["-x", key]
    elif impl == MPICH:
        if settings.ssh.port or settings.ssh.identity_file or settings.ssh.options or settings.ssh.config_file:
            raise MpiError("with MPICH's mpiexec, put ssh settings (port, identity) in ~/.ssh/config")
        cmd = [mpirun, "-n", str(np), "-hosts", to_mpi_hosts(hosts), *settings.binding_args]
        if settings.network_interfaces:
            cmd += ["-iface", settings.network_interfaces[0]]
        if settings.output_filename:
            os.makedirs(settings.output_filename, exist_ok=True)
            cmd += [
                "-outfile-pattern",
                os.path.join(settings.output_filename, "rank.%r.stdout"),
                "-errfile-pattern",
                os.path.join(settings.output_filename, "rank.%r.stderr"),
            ]
        # Hydra passes mpiexec's whole environment to every rank by default (-genvall).
    else:
        raise MpiError("unknown MPI implementation %r" % impl)
    return cmd + list(settings.mpi_args) + rank_lines_command(command, settings.prefix_timestamps)


def rank_lines_command(command: Sequence[str], timestamps: bool = False) -> List[str]:
    """``command`` run through the wrapper that writes whole lines tagged with the rank (rank_lines.py):
    mpirun's own tagging cuts lines that a rank writes in pieces."""
    return [
        sys.executable,
        "-m",
        "hvdlite.runner.rank_lines",
        *(["--timestamps"] if timestamps else []),
        "--",
        *command,
    ]


def exec_mpirun(
    settings: Settings,
    command: Sequence[str],
    environ: Optional[Mapping[str, str]] = None,
    mpirun_name: str = "mpirun",
) -> None:
    """Replaces this process with mpirun (its exit code and signal handling become the job's)."""
    settings.validate()
    mpirun = find_mpirun(mpirun_name)
    # Copied before the plugin is found: the path this process exports is this host's, and each rank finds
    # its own host's (built once per machine, then cached).
    environ = dict(os.environ if environ is None else environ)
    if "HVDLITE_CPU_OPERATIONS" not in environ and "HOROVOD_CPU_OPERATIONS" not in environ:
        # Found or built here before mpirun starts the ranks, so a machine without MPI's development files
        # fails at once, not once per rank after they started.
        missing = mpi_data_plane()
        if missing is not None:
            raise MpiError(
                "--mpi moves tensors through MPI, but %s. (HVDLITE_CPU_OPERATIONS=gloo keeps mpirun "
                "starting the ranks with the built-in data plane.)" % missing
            )
    env = rank_environment(settings, environ)
    cmd = mpirun_command(settings, command, env, mpirun, implementation(mpirun))
    if settings.verbose:
        print("hvdlite: running %s" % shlex.join(cmd), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execve(mpirun, cmd, env)
