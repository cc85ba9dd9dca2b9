"""Bootstrap from torchrun-style variables or inside a Slurm ``srun`` step: rank 0 runs the rendezvous service
in its own process and every rank exchanges addresses through it (where, and the secret: see bootstrap.py)."""

import hashlib
import re
import socket
import threading
import zlib
from typing import Mapping, Optional, Tuple

from hvdlite.common.placement import Placement, log

SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 12000

_server_lock = threading.Lock()
_server = None  # the RendezvousServer rank 0 runs, for the life of the process (re-init reuses it)


def torchrun_detected(env: Mapping[str, str]) -> bool:
    return "RANK" in env and "WORLD_SIZE" in env


def slurm_detected(env: Mapping[str, str]) -> bool:
    # SLURM_STEP_ID: only inside an srun step does every task have its own SLURM_PROCID (a batch script is
    # one process that merely sees SLURM_NTASKS).
    return (
        "SLURM_PROCID" in env
        and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env)
        and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env)
    )


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        raise RuntimeError(f"hvdlite: {name}={env.get(name)!r} is not an integer") from None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: ``node[003-005,9],gpu1`` -> ``node003``."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", nodelist.strip())
    if not match or not match.group(1) and not match.group(2):
        raise RuntimeError(f"hvdlite: cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def job_secret(env: Mapping[str, str], address: str, port: int, job_id: str, rank: int) -> bytes:
    """HVDLITE_SECRET (hex) or, without it, a key derived from public facts (see the trust model)."""
    text = env.get("HVDLITE_SECRET", "").strip()
    if text:
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            raise RuntimeError("hvdlite: HVDLITE_SECRET must be hex (e.g. openssl rand -hex 32)") from None
        if len(secret) < 16:
            raise RuntimeError("hvdlite: HVDLITE_SECRET must be at least 16 bytes (32 hex digits)")
        return secret
    if rank == 0:
        log(
            "warning",
            "HVDLITE_SECRET is not set: the rendezvous service and the data-plane listeners accept "
            "anyone who can reach them; export HVDLITE_SECRET=$(openssl rand -hex 32) on every rank "
            "to authenticate the job",
            rank,
            env,
        )
    return hashlib.sha256(f"hvdlite-public-key|{address}|{port}|{job_id}".encode()).digest()


def _rendezvous_location(
    env: Mapping[str, str], fallback_host: Optional[str], fallback_port: Optional[int], what: str
) -> Tuple[str, int]:
    host = env.get("HVDLITE_RENDEZVOUS_ADDR") or env.get("MASTER_ADDR") or fallback_host
    if not host:
        raise RuntimeError(f"hvdlite: {what}: set MASTER_ADDR (or HVDLITE_RENDEZVOUS_ADDR) to rank 0's host")
    if env.get("HVDLITE_RENDEZVOUS_PORT"):
        port = _int(env, "HVDLITE_RENDEZVOUS_PORT")
    elif env.get("MASTER_PORT"):
        port = _int(env, "MASTER_PORT") + 1
    elif fallback_port is not None:
        port = fallback_port
    else:
        raise RuntimeError(f"hvdlite: {what}: set MASTER_PORT (or HVDLITE_RENDEZVOUS_PORT)")
    return host, port


def torchrun_placement(env: Mapping[str, str]) -> Placement:
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    host, port = _rendezvous_location(env, None, None, f"RANK={rank} and WORLD_SIZE={size} are set")
    # torchrun's run id and restart count tell a restarted job from the previous attempt.
    job_id = env.get("HVDLITE_JOB_ID") or "torchrun.%s.%s" % (
        env.get("TORCHELASTIC_RUN_ID", "env"),
        env.get("TORCHELASTIC_RESTART_COUNT", "0"),
    )
    local_size = env.get("LOCAL_WORLD_SIZE")
    return Placement(
        rank=rank,
        size=size,
        hostname=env.get("HVDLITE_HOSTNAME") or socket.gethostname(),
        job_id=job_id,
        secret=job_secret(env, host, port, job_id, rank),
        rendezvous=(host, port),
        method="torchrun",
        serve_rendezvous=rank == 0,
        multi_host=local_size is not None and local_size.isdigit() and int(local_size) < size,
    )


def slurm_port(job: str, step: str) -> int:
    return SLURM_PORT_BASE + zlib.crc32(f"{job}.{step}".encode()) % SLURM_PORT_SPAN


def slurm_placement(env: Mapping[str, str]) -> Placement:
    rank = _int(env, "SLURM_PROCID")
    size = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID", "0")
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID", "0")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    host, port = _rendezvous_location(
        env, first_host(nodelist) if nodelist else None, slurm_port(job, step), f"Slurm task {rank} of {size}"
    )
    job_id = env.get("HVDLITE_JOB_ID") or f"slurm.{job}.{step}"
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    return Placement(
        rank=rank,
        size=size,
        hostname=env.get("HVDLITE_HOSTNAME") or env.get("SLURMD_NODENAME") or socket.gethostname(),
        job_id=job_id,
        secret=job_secret(env, host, port, job_id, rank),
        rendezvous=(host, port),
        method="slurm",
        serve_rendezvous=rank == 0,
        multi_host=nodes.isdigit() and int(nodes) > 1,
    )


def serve_rendezvous(placement: Placement) -> None:
    """Starts the rendezvous service on every interface at the agreed port, once per process."""
    global _server
    from hvdlite.common.rendezvous import RendezvousServer

    port = placement.rendezvous[1]
    with _server_lock:
        if _server is not None:
            if _server.address[1] == port:
                return
            _server.stop()
            _server = None
        try:
            _server = RendezvousServer(placement.secret, host="0.0.0.0", port=port).start()
        except OSError as exc:
            raise RuntimeError(
                f"hvdlite: rank 0 cannot run the rendezvous service on port {port} ({exc}); set "
                "HVDLITE_RENDEZVOUS_PORT to a free port, the same on every rank"
            ) from None
    log("info", f"rendezvous service on port {port} for {placement.size} ranks", placement.rank)
