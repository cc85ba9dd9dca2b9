"""Sharded optimizer state (ZeRO stage 1) for DistributedOptimizer(shard_optimizer_state=True).

Each member of the process set owns whole parameters, about 1/N of the bytes (largest first, each to the least
loaded rank: the same partition on every rank), and only its owned parameters are stepped, so the optimizer's
state (momentum, Adam's moments) exists for them alone. Gradients are still averaged for every parameter, as
without sharding; after the step each rank's updated parameters travel to all others in one allgather per dtype.
Whole parameters rather than slices keep any optimizer correct, element-wise or not (as torch's
ZeroRedundancyOptimizer does), and keep the state in the optimizer's own per-parameter form.

state_dict() of a sharded optimizer is the whole, unsharded one: consolidate_state_dict(to=r) first gathers
every rank's part on rank r (as ZeroRedundancyOptimizer's), and it loads into an unsharded optimizer of the
same parameters; load_state_dict() takes a whole state dict and keeps this rank's part.
"""

from typing import Dict, List, Tuple

import torch

from hvdlite.common.basics import rank, size
from hvdlite.torch import mpi_ops
from hvdlite.torch.functions import allgather_object


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in a torch optimizer's state (this rank's share, where it is sharded)."""
    return sum(
        v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
    )


def partition(params: List[torch.Tensor], members: int) -> List[int]:
    """The owner (index in the process set) of each parameter: largest first, to the least loaded member (the
    lowest index among equals), so every rank computes the same partition."""
    load = [0] * members
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-params[i].numel() * params[i].element_size(), i)):
        target = min(range(members), key=lambda m: (load[m], m))
        owner[i] = target
        load[target] += params[i].numel() * params[i].element_size()
    return owner


class ShardedState:
    def __init__(self, optimizer: torch.optim.Optimizer, params: List[torch.Tensor], process_set, name: str):
        self.optimizer = optimizer
        self.process_set = process_set
        self.name = name
        self.params = params
        self.members = self.me = None
        self.owner: Dict[int, int] = {}
        # dtype -> (its parameters, this rank's among them, where each parameter starts in the gathered buffer)
        self.layout: Dict[torch.dtype, Tuple[List[torch.Tensor], List[torch.Tensor], List[int]]] = {}
        self.consolidated = None  # the whole state dict, on the rank it was consolidated to
        self.refresh()

    def refresh(self) -> None:
        """The partition for the set as it is now: elastic training re-forms the job with other ranks."""
        ranks = self.process_set.ranks if self.process_set.process_set_id != 0 else list(range(size()))
        members, me = len(ranks), ranks.index(rank())
        if (members, me) == (self.members, self.me):
            return
        self.members, self.me = members, me
        self.owner = dict(zip((id(p) for p in self.params), partition(self.params, members)))
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for p in self.params:
            by_dtype.setdefault(p.dtype, []).append(p)
        self.layout = {}
        for dtype, params in by_dtype.items():
            # The gathered buffer holds member 0's parameters, then member 1's, ..., each in parameter order.
            starts, offset = {}, 0
            for member in range(members):
                for p in params:
                    if self.owner[id(p)] == member:
                        starts[id(p)] = offset
                        offset += p.numel()
            mine = [p for p in params if self.owner[id(p)] == me]
            self.layout[dtype] = (params, mine, [starts[id(p)] for p in params])

    def owns(self, p: torch.Tensor) -> bool:
        return self.owner.get(id(p), self.me) == self.me  # a parameter that is not trained: every rank's own

    def step(self, parent_step, closure=None):
        """Steps this rank's parameters only (the optimizer sees param_groups restricted to them), then brings
        every rank's updated parameters to all."""
        self.refresh()
        optimizer = self.optimizer
        full = optimizer.param_groups
        shard = [dict(group, params=[p for p in group["params"] if self.owns(p)]) for group in full]
        optimizer.param_groups = shard
        try:
            result = parent_step(closure)
        finally:
            optimizer.param_groups = full
            for whole, part in zip(full, shard):  # what the step changed in a group's settings, kept
                whole.update((key, value) for key, value in part.items() if key != "params")
        self.share_parameters()
        self.consolidated = None
        return result

    def share_parameters(self) -> None:
        for dtype, (params, mine, starts) in self.layout.items():
            flat = torch.cat([p.detach().reshape(-1) for p in mine]) if mine else params[0].new_empty(0)
            gathered = mpi_ops.allgather(flat, name=f"{self.name}.parameters.{dtype}", process_set=self.process_set)
            with torch.no_grad():
                for p, start in zip(params, starts):
                    if self.owner[id(p)] != self.me:
                        p.copy_(gathered[start : start + p.numel()].view_as(p))

    def consolidate(self, parent_state_dict, to) -> None:
        """Gathers every rank's part of the state on global rank `to`, or on every rank with to=None."""
        self.refresh()
        local = parent_state_dict()
        # The optimizer numbers the parameters it has state for by position in its param_groups: the same on
        # every rank, since param_groups hold every parameter.
        mine = dict(local["state"])
        parts = allgather_object(mine, name=f"{self.name}.consolidate", process_set=self.process_set)
        if to is None or rank() == to:
            whole = dict(local)
            whole["state"] = {}
            for part in parts:
                whole["state"].update(part)
            whole["state"] = dict(sorted(whole["state"].items()))
            self.consolidated = whole
        else:
            self.consolidated = None

    def state_dict(self):
        if self.consolidated is None:
            raise RuntimeError(
                "the optimizer state is sharded over the ranks (shard_optimizer_state=True) and has not been "
                f"consolidated on rank {rank()}: call optimizer.consolidate_state_dict(to={rank()}) on every rank "
                "first (after the last step)"
            )
        return self.consolidated

    def keep_own_state(self) -> None:
        """After a whole state dict was loaded: drops the state of parameters other ranks own."""
        self.refresh()
        for p in list(self.optimizer.state):
            if not self.owns(p):
                del self.optimizer.state[p]
