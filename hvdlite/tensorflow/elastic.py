"""hvdlite.tensorflow.elastic (Horovod's ``horovod.tensorflow.elastic``): state kept across membership changes of
an elastic job for TensorFlow variables and Keras models. The protocol and the retry loop are framework-neutral
(hvdlite/common/elastic.py); see hvdlite/torch/elastic for the PyTorch counterpart.

With ``run(checkpoint_dir=...)`` (or ``hvdlite-run --checkpoint-dir``), rank 0 also writes the committed state to
files (weights and optimizer variables as numpy arrays, plus the attributes), and a job started again resumes
from the newest one."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from hvdlite.common.basics import init, rank, shutdown
from hvdlite.common.elastic import HostsUpdatedInterrupt, State, run_fn
from hvdlite.tensorflow.functions import broadcast_object, broadcast_variables


def _reset() -> None:
    shutdown()
    init()


def run(func=None, *, checkpoint_dir=None, checkpoint_every=None, checkpoint_keep=None):
    """Decorator: ``func(state, ...)`` re-run from the last commit after a worker is lost, and re-entered after
    workers join. With ``checkpoint_dir`` (default: hvdlite-run's ``--checkpoint-dir``), rank 0 writes every
    ``checkpoint_every``-th commit there (default 1), keeps the newest ``checkpoint_keep`` (default 3), and the
    first call resumes from the newest. ``@run`` and ``@run(checkpoint_dir=...)`` both work."""
    return run_fn(
        func,
        _reset,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        checkpoint_keep=checkpoint_keep,
    )


def _check_count(what: str, saved: list, live: list) -> None:
    if len(saved) != len(live):
        raise ValueError(
            f"the checkpoint holds {len(saved)} {what}, this state has {len(live)}: was it written by another model?"
        )


class TensorFlowState(State):
    """Horovod's ``TensorFlowState(variables=None, session=None, **kwargs)``: a list of tf.Variables (and plain
    keyword attributes). Eager TensorFlow only: ``session`` must be None."""

    def __init__(self, variables: Optional[List[Any]] = None, session=None, **kwargs: Any):
        if session is not None:
            raise ValueError("hvdlite's TensorFlowState supports eager TensorFlow only (session must be None)")
        self.variables = list(variables or [])
        self._saved_values: List[np.ndarray] = []
        super().__init__(broadcast_object, rank, **kwargs)
        self._save_values()

    def save(self) -> None:
        super().save()
        self._save_values()

    def restore(self) -> None:
        super().restore()
        for variable, value in zip(self.variables, self._saved_values):
            variable.assign(value)

    def sync(self) -> None:
        if self.variables:
            broadcast_variables(self.variables, 0, name="elastic.TensorFlowState")
        super().sync()
        self._save_values()

    def _checkpoint_payload(self) -> Dict[str, Any]:
        return dict(super()._checkpoint_payload(), variables=self._saved_values)

    def _load_checkpoint_payload(self, payload: Dict[str, Any]) -> None:
        _check_count("variables", payload["variables"], self.variables)
        super()._load_checkpoint_payload(payload)
        self._saved_values = payload["variables"]

    def _save_values(self) -> None:
        self._saved_values = [np.array(v.numpy(), copy=True) for v in self.variables]


class TensorFlowKerasState(State):
    """Horovod's ``TensorFlowKerasState(model, optimizer=None, backend=None, **kwargs)``: a Keras model's weights
    and its optimizer's variables (slots, iteration count), plus plain keyword attributes (``epoch=0,
    batch=0``). The optimizer defaults to ``model.optimizer``; it is built first if training has not built it.

    With PowerSGD or top-k compression, each rank's residuals are committed and restored per rank and never
    broadcast; the step count and warm-start matrices are shared, taken from rank 0 by sync() and kept in
    checkpoint files (a job restarted from files begins with empty residuals), as are local SGD's step count,
    anchors and outer velocities; as in TorchState."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs: Any):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._saved_weights: List[np.ndarray] = []
        self._saved_optimizer: List[np.ndarray] = []
        self._saved_in_flight: Dict[str, Any] = {}  # bounded staleness: the averages not applied yet
        self._saved_extensions: Dict[str, Any] = {}  # PowerSGD / top-k, local SGD: their state_dict()
        super().__init__(broadcast_object, rank, **kwargs)
        self._save_values()

    def _stale_exchange(self):
        state = getattr(self.optimizer, "__dict__", {}).get("_hvd_state")
        return getattr(state, "stale", None)

    def _extensions(self) -> Dict[str, Any]:
        """The optimizer's stateful parts beyond its variables: error feedback, local SGD."""
        state = getattr(self.optimizer, "__dict__", {}).get("_hvd_state")
        found = {key: getattr(state, key, None) for key in ("feedback", "local_sgd")}
        return {key: value for key, value in found.items() if value is not None}

    def _optimizer_variables(self) -> list:
        if self.optimizer is None:
            return []
        if not getattr(self.optimizer, "built", True) and self.model.trainable_variables:
            self.optimizer.build(self.model.trainable_variables)
        return list(self.optimizer.variables)

    def save(self) -> None:
        super().save()
        self._save_values()

    def restore(self) -> None:
        super().restore()
        if self._saved_weights:
            self.model.set_weights(self._saved_weights)
        variables = self._optimizer_variables()
        if len(variables) == len(self._saved_optimizer):
            for variable, value in zip(variables, self._saved_optimizer):
                variable.assign(value)
        if self._stale_exchange() is not None:
            self._stale_exchange().load(self._saved_in_flight)
        for key, extension in self._extensions().items():
            if key in self._saved_extensions:
                extension.load_state_dict(self._saved_extensions[key])

    def sync(self) -> None:
        variables = list(self.model.weights) + self._optimizer_variables()
        if variables:
            broadcast_variables(variables, 0, name="elastic.TensorFlowKerasState")
        stale = self._stale_exchange()
        if stale is not None:
            stale.load(broadcast_object(stale.settle(), 0, name="elastic.TensorFlowKerasState.in_flight"))
        for key, extension in self._extensions().items():
            shared = broadcast_object(extension.shared_state(), 0, name=f"elastic.TensorFlowKerasState.{key}")
            extension.load_state_dict({"shared": shared})
        super().sync()
        self._save_values()

    def _checkpoint_payload(self) -> Dict[str, Any]:
        return dict(
            super()._checkpoint_payload(),
            weights=self._saved_weights,
            optimizer_variables=self._saved_optimizer,
            in_flight=self._saved_in_flight,
            extensions={key: saved["shared"] for key, saved in self._saved_extensions.items()},
        )

    def _load_checkpoint_payload(self, payload: Dict[str, Any]) -> None:
        _check_count("weights", payload["weights"], self.model.get_weights())
        _check_count("optimizer variables", payload["optimizer_variables"], self._optimizer_variables())
        super()._load_checkpoint_payload(payload)
        self._saved_weights = payload["weights"]
        self._saved_optimizer = payload["optimizer_variables"]
        self._saved_in_flight = payload.get("in_flight", {})
        saved = payload.get("extensions", {})
        self._saved_extensions = {key: {"shared": saved[key]} for key in self._extensions() if key in saved}

    def _save_values(self) -> None:
        self._saved_weights = [np.array(w, copy=True) for w in self.model.get_weights()]
        self._saved_optimizer = [np.array(v.numpy(), copy=True) for v in self._optimizer_variables()]
        stale = self._stale_exchange()
        self._saved_in_flight = stale.settle() if stale is not None else {}
        self._saved_extensions = {key: extension.state_dict() for key, extension in self._extensions().items()}


__all__ = ["HostsUpdatedInterrupt", "State", "TensorFlowKerasState", "TensorFlowState", "run"]
