"""TorchState: a model, an optimizer, samplers and plain attributes kept across membership changes."""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional

import torch

from hvdlite.common.basics import rank
from hvdlite.common.elastic import State
from hvdlite.torch.elastic.sampler import ElasticSampler
from hvdlite.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


class TorchState(State):
    """Horovod's ``hvd.elastic.TorchState(model=None, optimizer=None, **kwargs)``.

    ``commit()`` keeps an in-memory copy of the model's and optimizer's state dicts, of every ElasticSampler's
    position and of the other keyword attributes; ``restore()`` loads them back after a failure; ``sync()``
    broadcasts rank 0's (parameters, optimizer state, sampler positions, attributes) to every rank, so workers
    that joined start from the same point. With checkpoints on, rank 0 writes these saved copies to files
    (tensors moved to the CPU, so a checkpoint loads on a machine without the GPU that wrote it).

    An optimizer compressing with a reducer (PowerSGD, top-k) or averaging parameters periodically (local SGD)
    has state of two kinds: each rank's own (a reducer's residuals: that rank's unsent gradient), committed and
    restored per rank and never broadcast, and the state every rank shares (step counts, warm-start matrices,
    local SGD's anchor and outer momentum), which sync() takes from rank 0. A checkpoint file holds only the
    shared part: a job restarted from files begins with empty residuals.
    """

    def __init__(
        self,
        model: Optional[torch.nn.Module] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        **kwargs: Any,
    ):
        self.model = model
        self.optimizer = optimizer
        self._samplers: Dict[str, ElasticSampler] = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        plain = {k: v for k, v in kwargs.items() if k not in self._samplers}
        for key, sampler in self._samplers.items():
            setattr(self, key, sampler)
        self._saved_model: Optional[dict] = None
        self._saved_optimizer: Optional[dict] = None
        self._saved_samplers: Dict[str, dict] = {}
        self._saved_extensions: Dict[str, dict] = {}
        super().__init__(broadcast_object, rank, **plain)
        self._save_objects(self._optimizer_snapshot(collective=False))

    def save(self) -> None:
        # The snapshot may be collective (sharded optimizer state): taken first, so that one failing with a lost
        # peer leaves the last commit whole instead of half overwritten.
        optimizer_state = self._optimizer_snapshot()
        super().save()
        self._save_objects(optimizer_state)

    def restore(self) -> None:
        super().restore()
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for key, sampler in self._samplers.items():
            sampler.load_state_dict(self._saved_samplers[key])
        for key, extension in self._extensions().items():
            if key in self._saved_extensions:
                extension.load_state_dict(self._saved_extensions[key])

    def _extensions(self) -> Dict[str, Any]:
        """The optimizer's stateful parts beyond its state dict: its reducer, local SGD, bounded staleness."""
        found = {
            key: getattr(self.optimizer, key, None) for key in ("gradient_reducer", "local_sgd", "bounded_staleness")
        }
        return {key: value for key, value in found.items() if value is not None}

    def sync(self) -> None:
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        for key, sampler in self._samplers.items():
            sampler.load_state_dict(broadcast_object(sampler.state_dict(), 0, name=f"elastic.sampler.{key}"))
        for key, extension in self._extensions().items():
            shared = broadcast_object(extension.shared_state(), 0, name=f"elastic.{key}")
            extension.load_state_dict({"shared": shared})
        super().sync()
        self._save_objects(self._optimizer_snapshot())

    def _checkpoint_payload(self) -> Dict[str, Any]:
        payload = super()._checkpoint_payload()
        payload.update(
            model=_on_cpu(self._saved_model), optimizer=_on_cpu(self._saved_optimizer), samplers=self._saved_samplers
        )
        payload["extensions"] = {key: _on_cpu(saved["shared"]) for key, saved in self._saved_extensions.items()}
        return payload

    def _load_checkpoint_payload(self, payload: Dict[str, Any]) -> None:
        missing = sorted(set(self._samplers) - set(payload["samplers"]))
        if missing:
            raise ValueError(f"the checkpoint has no position for the sampler(s) {', '.join(missing)}")
        super()._load_checkpoint_payload(payload)
        # load_state_dict copies into the live tensors, on their device.
        self._saved_model = payload["model"]
        self._saved_optimizer = payload["optimizer"]
        self._saved_samplers = {key: payload["samplers"][key] for key in self._samplers}
        saved = payload.get("extensions", {})
        self._saved_extensions = {key: {"shared": saved[key]} for key in self._extensions() if key in saved}

    def _optimizer_snapshot(self, collective: bool = True) -> Optional[dict]:
        """A copy of the optimizer's state dict (None without an optimizer). Sharded state: every rank keeps the
        whole of it, so that any survivor can restore any part, which takes a collective (every rank saves at
        this point: commit, sync); None where the ranks do not (a state being made)."""
        if self.optimizer is None:
            return None
        if getattr(self.optimizer, "_hvd_sharded", None) is not None:
            if not collective:
                return None
            self.optimizer.consolidate_state_dict(to=None)
        return copy.deepcopy(self.optimizer.state_dict())

    def _save_objects(self, optimizer_state: Optional[dict]) -> None:
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if optimizer_state is not None:
            self._saved_optimizer = optimizer_state
        self._saved_samplers = {key: sampler.state_dict() for key, sampler in self._samplers.items()}
        self._saved_extensions = {key: extension.state_dict() for key, extension in self._extensions().items()}


def _on_cpu(value: Any) -> Any:
    """``value`` with every tensor in its dicts, lists and tuples copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(item) for item in value)
    return value
