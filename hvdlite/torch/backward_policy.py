"""When DistributedOptimizer reduces gradients during backward, and when all at once in synchronize().

Reducing during backward pays only where a core is free to do it. When the ranks' compute threads already fill
the host's cores (CPU training with local_size x torch threads >= cores), the reduction can only steal time from
backward, and interleaving the two costs more than running them in turn. There the hooks only note the gradient's
readiness, and synchronize() submits every noted gradient, in the order backward produced them, at once.
HVDLITE_REDUCE_DURING_BACKWARD=1/0 (or reduce_during_backward=True/False) overrides the automatic choice.
"""

import os
from typing import Optional

import torch

from hvdlite.common import basics


def cores_saturated_by_compute(local_size: int, torch_threads: int) -> bool:
    """Whether this host's ranks' compute threads already occupy every core this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return torch_threads >= cores or local_size * torch_threads >= (os.cpu_count() or 1)


def reduce_during_backward(requested: Optional[bool]) -> bool:
    if requested is not None:
        return bool(requested)
    value = os.environ.get("HVDLITE_REDUCE_DURING_BACKWARD", "auto").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value != "auto":
        raise ValueError(f"HVDLITE_REDUCE_DURING_BACKWARD={value!r}: expected auto, 1 or 0")
    return not cores_saturated_by_compute(basics.local_size(), torch.get_num_threads())
