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

    An optimizer compressing with a reducer (PowerSGD, top-k) has state of two kinds: each rank's residuals,
    committed and restored per rank and never broadcast (they are that rank's unsent gradient), and the state
    every rank shares (step count, warm-start matrices), which sync() takes from rank 0. A checkpoint file holds
    only the shared part: a job restarted from files begins with empty residuals.
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
        self._saved_reducer: Optional[dict] = None
        super().__init__(broadcast_object, rank, **plain)
        self._save_objects()

    def save(self) -> None:
        super().save()
        self._save_objects()

    def restore(self) -> None:
        super().restore()
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for key, sampler in self._samplers.items():
            sampler.load_state_dict(self._saved_samplers[key])
        if self._reducer() is not None and self._saved_reducer is not None:
            self._reducer().load_state_dict(self._saved_reducer)

    def _reducer(self):
        return getattr(self.optimizer, "gradient_reducer", None)

    def sync(self) -> None:
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        for key, sampler in self._samplers.items():
            sampler.load_state_dict(broadcast_object(sampler.state_dict(), 0, name=f"elastic.sampler.{key}"))
        reducer = self._reducer()
        if reducer is not None:
            shared = broadcast_object(reducer.shared_state(), 0, name="elastic.gradient_reducer")
            reducer.load_state_dict({"shared": shared})
        super().sync()
        self._save_objects()

    def _checkpoint_payload(self) -> Dict[str, Any]:
        payload = super()._checkpoint_payload()
        payload.update(
            model=_on_cpu(self._saved_model), optimizer=_on_cpu(self._saved_optimizer), samplers=self._saved_samplers
        )
        if self._saved_reducer is not None:
            payload["gradient_reducer"] = _on_cpu(self._saved_reducer["shared"])
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
        if self._reducer() is not None and "gradient_reducer" in payload:
            self._saved_reducer = {"shared": payload["gradient_reducer"]}

    def _save_objects(self) -> None:
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        self._saved_samplers = {key: sampler.state_dict() for key, sampler in self._samplers.items()}
        if self._reducer() is not None:
            self._saved_reducer = self._reducer().state_dict()


def _on_cpu(value: Any) -> Any:
    """``value`` with every tensor in its dicts, lists and tuples copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(item) for item in value)
    return value
