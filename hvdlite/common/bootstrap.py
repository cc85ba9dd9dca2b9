"""How a process learns its place in the job and its peers' addresses, before the core starts.

Protocol with the launcher (documented for `hvdlite-run` and any other starter):
  environment: HVDLITE_RANK, HVDLITE_SIZE, HVDLITE_LOCAL_RANK, HVDLITE_LOCAL_SIZE, HVDLITE_CROSS_RANK,
    HVDLITE_CROSS_SIZE, HVDLITE_HOSTNAME (host identity: equal names share memory), HVDLITE_RENDEZVOUS_ADDR,
    HVDLITE_RENDEZVOUS_PORT, HVDLITE_SECRET (hex, authenticates the rendezvous and every data connection),
    HVDLITE_JOB_ID; optional HVDLITE_ADVERTISE_ADDR (address peers should connect to).
  exchange: each rank opens its data-plane listener, then publishes JSON {"address", "host", "pid"} under key
    "<rank>" in scope "init.<job>.<n>" (n counts init() calls, so re-initialisation gets a fresh scope) and
    reads everyone else's.
With no launcher variables the process runs alone (size 1).
"""
import dataclasses
import json
import os
import socket
from typing import List, Optional


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


def detect(environ=None) -> Placement:
    env = os.environ if environ is None else environ
    if "HVDLITE_RANK" not in env:
        return Placement(hostname=socket.gethostname(), job_id=f"single{os.getpid()}")
    return Placement(
        rank=int(env["HVDLITE_RANK"]),
        size=int(env["HVDLITE_SIZE"]),
        local_rank=int(env.get("HVDLITE_LOCAL_RANK", 0)),
        local_size=int(env.get("HVDLITE_LOCAL_SIZE", 1)),
        cross_rank=int(env.get("HVDLITE_CROSS_RANK", 0)),
        cross_size=int(env.get("HVDLITE_CROSS_SIZE", 1)),
        hostname=env.get("HVDLITE_HOSTNAME") or socket.gethostname(),
        job_id=env.get("HVDLITE_JOB_ID", "job"),
        secret=bytes.fromhex(env.get("HVDLITE_SECRET", "")),
        rendezvous=(env["HVDLITE_RENDEZVOUS_ADDR"], int(env["HVDLITE_RENDEZVOUS_PORT"]))
        if "HVDLITE_RENDEZVOUS_ADDR" in env else None,
    )


def advertise_address(placement: Placement, environ=None) -> str:
    """The address peers should use to reach this rank: explicit, else the interface that routes to the
    rendezvous server (loopback for a one-host job)."""
    env = os.environ if environ is None else environ
    if env.get("HVDLITE_ADVERTISE_ADDR"):
        return env["HVDLITE_ADVERTISE_ADDR"]
    if placement.rendezvous is None:
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((placement.rendezvous[0], placement.rendezvous[1]))
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def exchange_peers(placement: Placement, address: str, generation: int, timeout: float) -> List[dict]:
    """Publishes this rank's listener and returns every rank's {"address", "host", "pid"}, in rank order."""
    from hvdlite.runner.rendezvous import RendezvousClient, exchange_all

    if placement.rendezvous is None:
        raise RuntimeError(
            f"rank {placement.rank} of {placement.size}: HVDLITE_RENDEZVOUS_ADDR is not set; start the job with "
            "hvdlite-run (or python -m hvdlite.runner.local)")
    client = RendezvousClient(placement.rendezvous[0], placement.rendezvous[1], placement.secret, timeout=timeout)
    mine = json.dumps({"address": address, "host": placement.hostname, "pid": os.getpid()}).encode()
    scope = f"init.{placement.job_id}.{generation}"
    return [json.loads(v) for v in exchange_all(client, scope, placement.rank, placement.size, mine, timeout)]
