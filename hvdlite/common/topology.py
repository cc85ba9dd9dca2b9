"""Where each rank sits: its rank, and its local and cross coordinates, from the host every rank runs on.

Shared by everything that forms a job (the launcher, the Ray executor) and by the ranks' own bootstrap under
MPI, torchrun and Slurm, which learn the hosts only by exchanging them.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Where one rank sits in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str


def topology_for_hosts(hosts: Sequence[str]) -> List[RankInfo]:
    """Coordinates of rank ``r`` running on host ``hosts[r]``.

    ``local_rank`` is the rank's index among the ranks of its host,
    ``local_size`` the number of ranks on it, ``cross_rank`` the index of its
    host among the distinct hosts in order of first appearance and
    ``cross_size`` the number of distinct hosts (as in Horovod for evenly
    populated hosts).
    """
    if not hosts:
        raise ValueError("the number of ranks must be at least 1, got 0")
    host_order: Dict[str, int] = {}
    ranks_on_host: Dict[str, int] = {}
    for host in hosts:
        host_order.setdefault(host, len(host_order))
        ranks_on_host[host] = ranks_on_host.get(host, 0) + 1

    infos = []
    seen_on_host: Dict[str, int] = {}
    for rank, host in enumerate(hosts):
        local_rank = seen_on_host.get(host, 0)
        seen_on_host[host] = local_rank + 1
        infos.append(
            RankInfo(
                rank=rank,
                size=len(hosts),
                local_rank=local_rank,
                local_size=ranks_on_host[host],
                cross_rank=host_order[host],
                cross_size=len(host_order),
                hostname=host,
            )
        )
    return infos
