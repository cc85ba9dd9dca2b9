"""Where a RayExecutor's workers go: one Ray placement group, one bundle per worker or per host.

pack        ``num_workers`` bundles of ``cpus_per_worker`` (+ GPUs), strategy PACK: Ray fills nodes one after the
            other, so workers share hosts (and shared memory) as much as the cluster allows.
colocated   ``num_hosts`` bundles of ``num_workers_per_host`` workers each, strategy STRICT_SPREAD: exactly that
            many workers on each of that many distinct nodes.

Either way the group is reserved before any worker starts, so a cluster without room fails at once with the
resources it lacked instead of starting half a job.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List


@dataclasses.dataclass(frozen=True)
class Strategy:
    bundles: List[Dict[str, float]]
    strategy: str  # Ray's placement strategy
    bundle_of_worker: List[int]  # worker index -> bundle index

    @property
    def num_workers(self) -> int:
        return len(self.bundle_of_worker)


def _resources(workers: int, cpus_per_worker: float, gpus_per_worker: float) -> Dict[str, float]:
    resources = {"CPU": workers * cpus_per_worker}
    if gpus_per_worker:
        resources["GPU"] = workers * gpus_per_worker
    return resources


def pack(num_workers: int, cpus_per_worker: float, gpus_per_worker: float) -> Strategy:
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    return Strategy(
        bundles=[_resources(1, cpus_per_worker, gpus_per_worker) for _ in range(num_workers)],
        strategy="PACK",
        bundle_of_worker=list(range(num_workers)),
    )


def colocated(num_hosts: int, num_workers_per_host: int, cpus_per_worker: float, gpus_per_worker: float) -> Strategy:
    if num_hosts < 1 or num_workers_per_host < 1:
        raise ValueError(
            f"num_hosts and num_workers_per_host must be at least 1, got {num_hosts} and {num_workers_per_host}"
        )
    bundle = _resources(num_workers_per_host, cpus_per_worker, gpus_per_worker)
    return Strategy(
        bundles=[dict(bundle) for _ in range(num_hosts)],
        strategy="STRICT_SPREAD",
        bundle_of_worker=[w // num_workers_per_host for w in range(num_hosts * num_workers_per_host)],
    )
