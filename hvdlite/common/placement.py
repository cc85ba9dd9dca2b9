"""What every bootstrap mechanism produces (a Placement) and the two helpers they share.

A leaf module: the mechanisms (mpi_bootstrap, cluster_bootstrap) and the dispatcher (bootstrap) import it, it
imports none of them.
"""

import dataclasses
import os
import sys
import time
from typing import Any, List, Mapping, Optional

_LOG_LEVELS = {"trace": 0, "debug": 1, "info": 2, "warning": 3, "warn": 3, "error": 4, "fatal": 5}


@dataclasses.dataclass
class Placement:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1
    hostname: str = "localhost"
    job_id: str = "single"
    secret: bytes = b""
    rendezvous: Optional[tuple] = None  # (host, port)
    method: str = "single"
    serve_rendezvous: bool = False  # this rank runs the rendezvous service (rank 0 under torchrun/Slurm)
    multi_host: bool = False  # known to span hosts: a loopback address would be unreachable
    peer_hosts: Optional[List[str]] = None  # every rank's host, when known before the exchange (MPI)
    comm: Any = dataclasses.field(default=None, repr=False, compare=False)  # mpi4py communicator (MPI)
    exchange_scope: Optional[str] = None  # rendezvous scope of the address exchange (elastic: per round)


def env_value(env: Mapping[str, str], name: str, default: Optional[str] = None) -> Optional[str]:
    """HVDLITE_<name>, else Horovod's HOROVOD_<name>, else default."""
    return env.get("HVDLITE_" + name) or env.get("HOROVOD_" + name) or default


def log(level: str, message: str, rank: Optional[int] = None, environ: Optional[Mapping[str, str]] = None) -> None:
    """Bootstrap messages, in the core's layout (Horovod's: time, level letter, rank) and filtered by the same
    HVDLITE_LOG_LEVEL, in either case; HVDLITE_LOG_HIDE_TIME leaves the time out."""
    env = os.environ if environ is None else environ
    threshold = _LOG_LEVELS.get((env_value(env, "LOG_LEVEL") or "warning").lower(), _LOG_LEVELS["warning"])
    if _LOG_LEVELS[level] < threshold:
        return
    where = "%s hvdlite rank %s" % (level[0].upper(), "?" if rank is None else rank)
    if (env_value(env, "LOG_HIDE_TIME") or "0").lower() not in ("0", "false", "no", "off"):
        print("[%s] %s" % (where, message), file=sys.stderr, flush=True)
    else:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        print("[%s.%06d: %s] %s" % (stamp, int(now % 1 * 1e6), where, message), file=sys.stderr, flush=True)
