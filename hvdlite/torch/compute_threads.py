"""Each rank's share of its host's CPUs for torch's compute threads, where the job left the count open.

torch's pool has a thread for every CPU by default. Ranks sharing a host each start such a pool, and once their
threads outnumber the cores, OpenMP's waiting threads spin in each other's way and every step slows (measured in
docs/torch.md). torchrun sets OMP_NUM_THREADS=1 for every rank for that reason; here each rank keeps the host's
CPUs divided by the ranks on it, so a large host with few ranks keeps its cores busy. Nothing changes where
OMP_NUM_THREADS is set or the ranks' threads already fit the host.

An elastic job shares again at every round, since workers joining or leaving the host change each rank's share:
from the pool's size before hvdlite first lowered it, as long as the count is still the one hvdlite chose (a
count the script set after init() is the script's).
"""

import os
from typing import Optional

import torch

from hvdlite.common import basics, placement

_chosen: Optional[int] = None  # the count hvdlite set, while it is in force
_unshared: Optional[int] = None  # the count before hvdlite lowered it
_left_to_script = False  # the script set a count of its own after hvdlite's: never changed again


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), which is what torch's default pool counts."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def share_host_cpus(rank: int, local_size: int) -> None:
    """Sets torch's thread count to this rank's share when local_size ranks' threads would oversubscribe the
    host, and back to the pool's own size where they no longer would, unless the environment or the script fixed
    the count."""
    global _chosen, _unshared, _left_to_script
    if "OMP_NUM_THREADS" in os.environ or _left_to_script:
        return
    threads, cpus = torch.get_num_threads(), host_cpus()
    if _chosen is not None and threads != _chosen:
        _left_to_script = True
        return
    unshared = threads if _chosen is None else _unshared
    target = unshared if unshared * local_size <= cpus else max(1, cpus // local_size)
    if target != threads:
        torch.set_num_threads(target)
        placement.log(
            "info",
            f"{local_size} rank(s) on this host with {unshared} torch threads each would oversubscribe its {cpus} "
            f"CPUs: {target} each (set OMP_NUM_THREADS to choose)"
            if target < unshared
            else f"{local_size} rank(s) on this host: back to {target} torch threads each",
            rank,
        )
    _chosen, _unshared = (target, unshared) if target != unshared else (None, None)


def init(comm=None, process_sets=None) -> None:
    """hvdlite.torch.init, which each elastic round re-initialises with too: joins the job as
    hvdlite.common.basics.init does, then, where this host's ranks' torch threads would outnumber its CPUs and
    OMP_NUM_THREADS is unset, gives this rank its share of them."""
    basics.init(comm, process_sets)
    share_host_cpus(basics.rank(), basics.local_size())
