"""Each rank's share of its host's CPUs for torch's compute threads, where the job left the count open.

torch's pool has a thread for every CPU by default. Ranks sharing a host each start such a pool, and once their
threads outnumber the cores, OpenMP's waiting threads spin in each other's way and every step slows (measured in
docs/torch.md). torchrun sets OMP_NUM_THREADS=1 for every rank for that reason; here each rank keeps the host's
CPUs divided by the ranks on it, so a large host with few ranks keeps its cores busy. Nothing changes where
OMP_NUM_THREADS is set or the ranks' threads already fit the host.
"""

import os

import torch

from hvdlite.common import placement


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), which is what torch's default pool counts."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def share_host_cpus(rank: int, local_size: int) -> None:
    """Lowers torch's thread count to this rank's share when local_size ranks' threads would oversubscribe the
    host and the environment does not fix the count."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    threads, cpus = torch.get_num_threads(), host_cpus()
    if threads * local_size <= cpus:
        return
    share = max(1, cpus // local_size)
    torch.set_num_threads(share)
    placement.log(
        "info",
        f"{local_size} ranks on this host with {threads} torch threads each would oversubscribe its {cpus} CPUs: "
        f"{share} each (set OMP_NUM_THREADS to choose)",
        rank,
    )
