"""How a process learns its place in the job and its peers' addresses, before the core starts.

Every rank opens its data-plane listener, learns every rank's {"address", "host", "pid"} through one of the
mechanisms below, and hands the list to the core, which connects the mesh and authenticates every connection
with the job secret (hvdlite_core/src/transport/handshake.h). Ranks with the same host identity share memory.

Which mechanism: ``hvd.init(comm=...)`` means MPI; otherwise HVDLITE_BOOTSTRAP (launcher, mpi, torchrun, slurm,
single) if set, else the first that matches the environment, in this order:

0. elastic (``hvdlite-run --host-discovery-script ...``): HVDLITE_ELASTIC=1 and HVDLITE_WORKER_ID; the rank and
   the layout come from the driver at every init (the round protocol in hvdlite/common/elastic.py), the
   rendezvous and secret variables as for the launcher.
1. launcher (``hvdlite-run``, ``python -m hvdlite.runner.local``, ``hvdlite.run``): HVDLITE_RANK is set.
   environment: HVDLITE_RANK, HVDLITE_SIZE, HVDLITE_LOCAL_RANK, HVDLITE_LOCAL_SIZE, HVDLITE_CROSS_RANK,
     HVDLITE_CROSS_SIZE, HVDLITE_HOSTNAME (host identity: equal names share memory), HVDLITE_RENDEZVOUS_ADDR,
     HVDLITE_RENDEZVOUS_PORT, HVDLITE_SECRET (hex, authenticates the rendezvous and every data connection),
     HVDLITE_JOB_ID; optional HVDLITE_ADVERTISE_ADDR (address peers should connect to).
   exchange: each rank publishes JSON {"address", "host", "pid"} under key "<rank>" in scope
     "init.<job>.<n>" (n counts init() calls, so re-initialisation gets a fresh scope) of the launcher's
     rendezvous service (hvdlite/common/rendezvous.py) and reads everyone else's.
2. mpi: mpirun's variables (Open MPI OMPI_COMM_WORLD_SIZE, MPICH/Intel PMI_SIZE, MVAPICH MV2_COMM_WORLD_SIZE)
   with a size above 1, or ``init(comm=...)`` (an mpi4py communicator, or a list of COMM_WORLD ranks).
   Ranks and size are the communicator's (a duplicate of it, so our messages never mix with the
   application's). Rank 0 draws a random secret and job id and broadcasts them; the hosts
   (HVDLITE_HOSTNAME or the hostname), then the listener addresses, are exchanged with ``allgather``.
   Nothing crosses the network outside MPI. Needs mpi4py (``pip install hvdlite[mpi]``).
3. torchrun: RANK and WORLD_SIZE (torchrun, torch.distributed-style launchers, Kubernetes PyTorchJob).
4. slurm: a task of an ``srun`` step (SLURM_PROCID, SLURM_STEP_ID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS).
   For 3 and 4, rank 0 runs the same rendezvous service as the launcher, inside its own process, and every
   rank uses the launcher's exchange with it. Where (same value on every rank):
     address: HVDLITE_RENDEZVOUS_ADDR, else MASTER_ADDR, else (Slurm) the first node of SLURM_STEP_NODELIST,
       where task 0 runs with Slurm's block and cyclic distributions.
     port: HVDLITE_RENDEZVOUS_PORT, else MASTER_PORT + 1 (MASTER_PORT itself belongs to torchrun's agent
       store or to torch.distributed), else (Slurm) 20000 + crc32("<job>.<step>") % 12000, below Linux's
       ephemeral range so that no outgoing connection holds it.
   Local and cross ranks are derived from the exchanged hosts (as the launcher computes them).
5. single: none of the above; the process runs alone (size 1).

Secret and trust model. The launcher and MPI generate a fresh 32-byte secret per job and hand it to the ranks
only through their environment (ssh: over the encrypted channel's stdin, see launcher/ssh.py) or MPI.
Under torchrun and Slurm there is no private channel to every rank, so: set HVDLITE_SECRET (hex, the same on
every rank, e.g. ``export HVDLITE_SECRET=$(openssl rand -hex 32)`` in the batch script) and nobody without it
can read or write the rendezvous or open a data connection. Without it the key is derived from public job
facts (address, port, job id): it still separates concurrent jobs and rejects stray or garbled connections,
but anyone who can reach the ports can join, like torch.distributed's TCPStore, Gloo and NCCL. Rank 0 warns.
"""

import dataclasses
import json
import os
import socket
from typing import List, Mapping, Optional

from hvdlite.common import cluster_bootstrap, elastic, mpi_bootstrap
from hvdlite.common.placement import Placement, env_value, log  # noqa: F401 - re-exported for callers

METHODS = ("elastic", "launcher", "mpi", "torchrun", "slurm", "single")


def _launcher_placement(env: Mapping[str, str]) -> Placement:
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
        if "HVDLITE_RENDEZVOUS_ADDR" in env
        else None,
        method="launcher",
    )


def detect_method(env: Mapping[str, str]) -> str:
    forced = env.get("HVDLITE_BOOTSTRAP")
    if forced:
        if forced not in METHODS:
            raise ValueError("HVDLITE_BOOTSTRAP=%s: expected one of %s" % (forced, ", ".join(METHODS)))
        return forced
    if elastic.enabled(env):
        return "elastic"
    if "HVDLITE_RANK" in env:
        return "launcher"
    if mpi_bootstrap.detected(env):
        return "mpi"
    if cluster_bootstrap.torchrun_detected(env):
        return "torchrun"
    if cluster_bootstrap.slurm_detected(env):
        return "slurm"
    return "single"


def detect(environ: Optional[Mapping[str, str]] = None, comm=None) -> Placement:
    """This process's placement. Collective over the communicator for MPI (every rank must call it)."""
    env = os.environ if environ is None else environ
    method = "mpi" if comm is not None else detect_method(env)
    if method == "elastic":
        placement = elastic.placement(env)
    elif method == "launcher":
        placement = _launcher_placement(env)
    elif method == "mpi":
        placement = mpi_bootstrap.placement(comm, env)
    elif method == "torchrun":
        placement = cluster_bootstrap.torchrun_placement(env)
    elif method == "slurm":
        placement = cluster_bootstrap.slurm_placement(env)
    else:
        return Placement(hostname=env.get("HVDLITE_HOSTNAME") or socket.gethostname(), job_id=f"single{os.getpid()}")
    log(
        "debug",
        f"bootstrap through {method}: rank {placement.rank} of {placement.size} on {placement.hostname}",
        placement.rank,
        env,
    )
    return placement


def advertise_address(placement: Placement, environ=None) -> str:
    """The address peers should use to reach this rank: HVDLITE_ADVERTISE_ADDR; else the address of the first
    interface of HVDLITE_NETWORK_INTERFACE (comma-separated) this host has; else the one on the route to the
    rendezvous service (MPI: to the first rank on another host); loopback when every rank is on this host."""
    from hvdlite.common import network

    env = os.environ if environ is None else environ
    if env.get("HVDLITE_ADVERTISE_ADDR"):
        return env["HVDLITE_ADVERTISE_ADDR"]
    nics = env_value(env, "NETWORK_INTERFACE") or env.get("HOROVOD_GLOO_IFACE")
    if nics:
        address = network.first_interface_ipv4(nics.split(","))
        if address is None:
            raise RuntimeError(
                f"rank {placement.rank}: none of the network interfaces {nics} "
                f"(HVDLITE_NETWORK_INTERFACE) has an IPv4 address on {socket.gethostname()}"
            )
        return address
    if placement.peer_hosts is not None:
        others = [host for host in placement.peer_hosts if host != placement.hostname]
        target = others[0] if others else None
    else:
        target = placement.rendezvous[0] if placement.rendezvous else None
    if target is None:
        return "127.0.0.1"
    try:
        address = network.source_address_for(target)
    except OSError as exc:
        raise RuntimeError(
            f"rank {placement.rank}: cannot find a route to {target} to choose the address "
            f"other ranks reach this one at ({exc}); set HVDLITE_NETWORK_INTERFACE or "
            "HVDLITE_ADVERTISE_ADDR"
        ) from None
    # A host name that resolves to loopback here (Debian maps the hostname to 127.0.1.1) would hand ranks on
    # other hosts an address they cannot reach. An explicit loopback target means a one-machine job.
    if (
        network.is_loopback_name(address)
        and not network.is_loopback_name(target)
        and (placement.multi_host or placement.peer_hosts is not None)
    ):
        raise RuntimeError(
            f"rank {placement.rank}: {target} resolves to a loopback address here, which ranks "
            "on other hosts cannot reach; use a routable address for MASTER_ADDR/"
            "HVDLITE_RENDEZVOUS_ADDR (or fix /etc/hosts), or set HVDLITE_NETWORK_INTERFACE"
        )
    return address


def exchange_peers(placement: Placement, address: str, generation: int, timeout: float) -> List[dict]:
    """Publishes this rank's listener and returns every rank's {"address", "host", "pid"}, in rank order."""
    mine = {"address": address, "host": placement.hostname, "pid": os.getpid()}
    if placement.method == "mpi":
        return mpi_bootstrap.allgather(placement, mine)

    from hvdlite.common.rendezvous import RendezvousClient, exchange_all

    if placement.rendezvous is None:
        raise RuntimeError(
            f"rank {placement.rank} of {placement.size}: HVDLITE_RENDEZVOUS_ADDR is not set; start the job with "
            "hvdlite-run (or python -m hvdlite.runner.local)"
        )
    host, port = placement.rendezvous
    if placement.serve_rendezvous:
        cluster_bootstrap.serve_rendezvous(placement)
        host = "127.0.0.1"  # the service listens on every interface; MASTER_ADDR may not route to us
    client = RendezvousClient(host, port, placement.secret, timeout=timeout)
    scope = placement.exchange_scope or f"init.{placement.job_id}.{generation}"
    values = exchange_all(client, scope, placement.rank, placement.size, json.dumps(mine).encode(), timeout)
    return [json.loads(v) for v in values]


def complete_layout(placement: Placement, peers: List[dict]) -> Placement:
    """Local and cross ranks from the exchanged hosts, for the mechanisms whose environment does not give
    them (the launcher's variables are kept as they are)."""
    if placement.method in ("launcher", "elastic", "single"):
        return placement
    from hvdlite.common.topology import topology_for_hosts

    info = topology_for_hosts([peer["host"] for peer in peers])[placement.rank]
    return dataclasses.replace(
        placement,
        local_rank=info.local_rank,
        local_size=info.local_size,
        cross_rank=info.cross_rank,
        cross_size=info.cross_size,
    )
