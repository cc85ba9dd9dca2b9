"""Bootstrap under an MPI launcher (mpirun, mpiexec, srun with PMI) or from ``hvd.init(comm=...)``: the
placement and the address exchange go through mpi4py collectives (see bootstrap.py for the protocol)."""

import os
import secrets
import socket
from typing import List, Mapping, Optional

from hvdlite.common.placement import Placement

# World-size variables set by MPI launchers for each process: Open MPI, MPICH/Intel MPI (Hydra), MVAPICH.
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


def detected(env: Mapping[str, str]) -> bool:
    """True under an MPI launcher that started more than one process (one process needs no MPI at all)."""
    for name in SIZE_VARIABLES:
        try:
            if int(env.get(name, "0")) > 1:
                return True
        except ValueError:
            pass
    return False


def _mpi(env: Mapping[str, str]):
    try:
        from mpi4py import MPI
    except ImportError as exc:
        found = ", ".join(f"{name}={env[name]}" for name in SIZE_VARIABLES if name in env) or "init(comm=...)"
        raise RuntimeError(
            f"hvdlite: this process runs under MPI ({found}) but mpi4py cannot be imported ({exc}); install it "
            "with pip install 'hvdlite[mpi]', or start the job with hvdlite-run"
        ) from None
    return MPI


def _communicator(MPI, comm):
    """The communicator to bootstrap over: COMM_WORLD, the given one, or the group of COMM_WORLD ranks given
    as a list (Horovod's ``init(comm=[...])``; only those ranks call init)."""
    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, (list, tuple, range)):
        ranks = sorted(int(r) for r in comm)
        world = MPI.COMM_WORLD
        if world.Get_rank() not in ranks:
            raise ValueError(
                f"hvdlite: init(comm={ranks}) called on COMM_WORLD rank {world.Get_rank()}, which is not in the list"
            )
        group = world.Get_group().Incl(ranks)
        try:
            return world.Create_group(group)
        finally:
            group.Free()
    if not (hasattr(comm, "Get_rank") and hasattr(comm, "allgather")):
        raise TypeError(
            f"hvdlite: init(comm=...) expects an mpi4py communicator or a list of ranks, got {type(comm).__name__}"
        )
    return comm


def placement(comm, env: Optional[Mapping[str, str]] = None) -> Placement:
    """Collective over ``comm`` (default COMM_WORLD)."""
    env = os.environ if env is None else env
    MPI = _mpi(env)
    # Our own duplicate: the bootstrap's collectives can never match the application's messages.
    comm = _communicator(MPI, comm).Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    hostname = env.get("HVDLITE_HOSTNAME") or socket.gethostname()
    secret, job = comm.bcast((secrets.token_bytes(32), secrets.token_hex(6)) if rank == 0 else None, root=0)
    hosts = comm.allgather(hostname)
    return Placement(
        rank=rank,
        size=size,
        hostname=hostname,
        job_id=f"mpi.{job}",
        secret=secret,
        method="mpi",
        multi_host=len(set(hosts)) > 1,
        peer_hosts=hosts,
        comm=comm,
    )


def allgather(placement: Placement, mine: dict) -> List[dict]:
    return list(placement.comm.allgather(mine))


def world_ranks(placement: Placement, comm) -> List[int]:
    """The hvdlite ranks of an mpi4py communicator's members (ranks of the communicator hvdlite was
    initialised over)."""
    from mpi4py import MPI

    base = placement.comm if placement.comm is not None else MPI.COMM_WORLD
    group = comm.Get_group()
    return list(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), base.Get_group()))
