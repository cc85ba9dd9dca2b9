"""Periodic parameter averaging (local SGD) for DistributedOptimizer(sync_every=k).

Each rank steps on its own gradients and the ranks average their parameters every k steps: one fused allreduce of
the model every k steps instead of one of the gradients every step, for links too slow for the latter. Optionally
the averaged change since the last average is applied through an outer SGD with Nesterov momentum (as in
DiLoCo-style local SGD): the "outer gradient" is anchor - average, where the anchor is the parameters every rank
agreed on at the last average. With outer_lr=1 and outer_momentum=0 that is plain averaging. The first
`warmup_steps` steps average gradients as usual (fully synchronous), since early training moves too fast for
ranks to drift apart safely.
"""

from typing import Dict, List

import torch

from hvdlite.common import basics, slow_link_settings
from hvdlite.common.ops import Average


class LocalSGD:
    def __init__(
        self,
        params: List[torch.Tensor],
        names: Dict[int, str],
        optimizer: torch.optim.Optimizer,
        process_set,
        collectives,
        sync_every: int,
        warmup_steps: int = 0,
        outer_lr: float = 1.0,
        outer_momentum: float = 0.0,
        average_optimizer_state: bool = False,
    ):
        slow_link_settings.check_local_sgd(sync_every, warmup_steps, outer_lr, outer_momentum)
        self.params = params
        self.names = names
        self.optimizer = optimizer
        self.process_set = process_set
        self.collectives = collectives  # hvdlite.torch.mpi_ops, passed in (it imports the optimizer's users)
        self.sync_every = sync_every
        self.warmup_steps = warmup_steps
        self.outer_lr = outer_lr
        self.outer_momentum = outer_momentum
        self.average_optimizer_state = average_optimizer_state
        self.steps = 0  # optimizer steps taken, warm-up included
        self.anchors: Dict[str, torch.Tensor] = {}
        self.velocities: Dict[str, torch.Tensor] = {}

    @property
    def uses_outer_step(self) -> bool:
        return self.outer_lr != 1.0 or self.outer_momentum != 0.0

    def synchronous_now(self) -> bool:
        """Whether the coming step averages gradients (a warm-up step)."""
        return self.steps < self.warmup_steps

    def after_step(self) -> None:
        """Called after every optimizer step: counts it, and averages the parameters when a period ends."""
        self.steps += 1
        averaged = 0
        if self.steps <= self.warmup_steps:
            if self.steps == self.warmup_steps and self.uses_outer_step:
                self._set_anchors()  # the ranks agree here: the synchronous steps kept them equal
        elif (self.steps - self.warmup_steps) % self.sync_every == 0:
            averaged = self.average()
        since = 0 if self.steps <= self.warmup_steps else (self.steps - self.warmup_steps) % self.sync_every
        basics.timeline_counter("local_sgd", {"averaged_bytes": averaged, "steps_since_average": since})

    def average(self) -> int:
        """Averages the parameters (and, if asked, the optimizer's per-parameter state) over the process set;
        returns the bytes averaged."""
        tensors = [p.data for p in self.params]
        names = [f"local_sgd.{self.names[id(p)]}" for p in self.params]
        if self.average_optimizer_state:
            for p in self.params:
                for key, value in sorted(self.optimizer.state.get(p, {}).items()):
                    if torch.is_tensor(value) and value.is_floating_point() and value.shape == p.shape:
                        tensors.append(value)
                        names.append(f"local_sgd.{self.names[id(p)]}.{key}")
        handles = [
            self.collectives.allreduce_async_(t, name=n, op=Average, process_set=self.process_set)
            for t, n in zip(tensors, names)
        ]
        for handle in handles:
            self.collectives.synchronize(handle)
        if self.uses_outer_step:
            self._outer_step()
        return sum(t.numel() * t.element_size() for t in tensors)

    def _set_anchors(self) -> None:
        self.anchors = {self.names[id(p)]: p.detach().clone() for p in self.params}

    def _outer_step(self) -> None:
        if not self.anchors:
            self._set_anchors()  # no warm-up: the parameters were broadcast before the first step, so equal
            return
        with torch.no_grad():
            for p in self.params:
                name = self.names[id(p)]
                anchor = self.anchors[name]
                outer_gradient = anchor - p.data
                velocity = self.velocities.get(name)
                if velocity is None:
                    velocity = self.velocities[name] = torch.zeros_like(anchor)
                velocity.mul_(self.outer_momentum).add_(outer_gradient)
                anchor.sub_(outer_gradient.add(velocity, alpha=self.outer_momentum), alpha=self.outer_lr)
                p.data.copy_(anchor)

    # -- state (elastic): every part is identical on every rank after an average
    def shared_state(self) -> dict:
        clone = lambda d: {k: v.detach().clone() for k, v in d.items()}  # noqa: E731
        return {"steps": self.steps, "anchors": clone(self.anchors), "velocities": clone(self.velocities)}

    def state_dict(self) -> dict:
        return {"local": {}, "shared": self.shared_state()}

    def load_state_dict(self, state: dict) -> None:
        shared = state.get("shared")
        if shared is not None:
            self.steps = int(shared["steps"])
            self.anchors = {k: v.detach().clone() for k, v in shared["anchors"].items()}
            self.velocities = {k: v.detach().clone() for k, v in shared["velocities"].items()}
