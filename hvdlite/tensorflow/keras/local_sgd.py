"""Periodic parameter averaging (local SGD) for the Keras DistributedOptimizer (sync_every=k), as
hvdlite.torch.local_sgd does for PyTorch (the same settings, schedule and outer Nesterov step).

Each update first asks a stateful `tf.numpy_function` whether it is a warm-up update (those reduce the gradients
as usual); every other update applies this rank's own gradients. After the update a second one counts it and, when
a period ends, averages the weights (and, with average_optimizer_state, the optimizer's slots shaped like them)
over the process set in one allreduce per dtype, applies the outer step on the Python side and returns the new
values, which a `tf.cond` assigns. The step count, anchors and outer velocities live outside TensorFlow's tracking;
TensorFlowKerasState commits, restores and syncs them.
"""

import collections
from typing import Dict, List

import numpy as np
import tensorflow as tf

from hvdlite.common import ops, slow_link_settings
from hvdlite.common.basics import OP_ALLREDUCE, timeline_counter
from hvdlite.common.ops import Average
from hvdlite.tensorflow import bridge


class LocalSGD:
    def __init__(
        self,
        prefix: str,
        process_set,
        sync_every: int,
        warmup_steps: int = 0,
        outer_lr: float = 1.0,
        outer_momentum: float = 0.0,
        average_optimizer_state: bool = False,
    ):
        slow_link_settings.check_local_sgd(sync_every, warmup_steps, outer_lr, outer_momentum)
        self.prefix = prefix
        self.process_set = process_set
        self.sync_every = sync_every
        self.warmup_steps = warmup_steps
        self.outer_lr = outer_lr
        self.outer_momentum = outer_momentum
        self.average_optimizer_state = average_optimizer_state
        self.steps = 0  # updates applied, warm-up included
        self.weights = 0  # how many of the averaged values are weights (the slots follow them)
        self.anchors: Dict[str, np.ndarray] = {}
        self.velocities: Dict[str, np.ndarray] = {}

    @property
    def uses_outer_step(self) -> bool:
        return self.outer_lr != 1.0 or self.outer_momentum != 0.0

    # ---------------------------------------------------------------- graph side

    def apply(self, optimizer, grads, variables, trainable_variables, reduce, parent_apply) -> None:
        """One update: reduced gradients during the warm-up, this rank's own after it; then the period's average."""
        bridge.check_not_xla("the parameter average (DistributedOptimizer(sync_every=...))")
        warm = tf.numpy_function(self._warm_up_now, [], tf.bool, stateful=True, name="HvdliteLocalSgdWarmUp")
        warm.set_shape([])
        dense = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        tf.cond(
            warm,
            lambda: parent_apply(reduce(dense, variables), trainable_variables),
            lambda: parent_apply(dense, trainable_variables),
        )
        averaged = list(variables) + self._slots(optimizer, variables)
        self.weights = len(variables)
        values = [tf.convert_to_tensor(v) for v in averaged]  # read after the update (automatic control deps)
        outputs = tf.numpy_function(
            self.after_update, values, [tf.bool] + [v.dtype for v in values], stateful=True, name="HvdliteLocalSgd"
        )
        due, new_values = outputs[0], outputs[1:]
        due.set_shape([])

        def assign():
            for variable, value, old in zip(averaged, new_values, values):
                value.set_shape(old.shape)
                variable.assign(value)

        tf.cond(due, assign, lambda: None)

    def _slots(self, optimizer, variables) -> list:
        """The optimizer's floating-point variables shaped like a weight (momentum, Adam's moments), in a fixed
        order, when average_optimizer_state asks for them."""
        if not self.average_optimizer_state:
            return []
        shapes = {tuple(v.shape) for v in variables}
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        return [
            v
            for v in inner.variables
            if len(v.shape) and tuple(v.shape) in shapes and tf.as_dtype(v.dtype).is_floating
        ]

    # ---------------------------------------------------------------- numpy side (the ops' bodies)

    def _warm_up_now(self):
        return np.bool_(self.steps < self.warmup_steps)

    def after_update(self, *values) -> List[np.ndarray]:
        self.steps += 1
        due = False
        if self.steps <= self.warmup_steps:
            if self.steps == self.warmup_steps and self.uses_outer_step:
                self._set_anchors(values)  # the synchronous updates kept the ranks equal
        elif (self.steps - self.warmup_steps) % self.sync_every == 0:
            values = self._average(values)
            due = True
        since = 0 if self.steps <= self.warmup_steps else (self.steps - self.warmup_steps) % self.sync_every
        timeline_counter(
            "local_sgd",
            {"averaged_bytes": sum(v.nbytes for v in values) if due else 0, "steps_since_average": since},
        )
        return [np.bool_(due)] + [np.asarray(v) for v in values]

    def _average(self, values) -> List[np.ndarray]:
        groups = collections.defaultdict(list)
        for i, v in enumerate(values):
            groups[v.dtype.name].append(i)
        dtypes = sorted(groups)
        flats = [np.concatenate([values[i].reshape(-1) for i in groups[d]]) for d in dtypes]
        collectives = [
            bridge.Collective(
                OP_ALLREDUCE,
                f"{self.prefix}.local_sgd.{d}",
                ops.core_reduce_op(Average),
                process_set_id=bridge.process_set_id(self.process_set),
                in_place=True,
            )
            for d in dtypes
        ]
        averaged = list(values)
        for d, flat in zip(dtypes, bridge.finish(bridge.start(collectives, *flats))):
            offset = 0
            for i in groups[d]:
                averaged[i] = flat[offset : offset + values[i].size].reshape(values[i].shape)
                offset += values[i].size
        if self.uses_outer_step:
            averaged = self._outer_step(averaged)
        return averaged

    def _set_anchors(self, values) -> None:
        self.anchors = {str(i): np.array(v, copy=True) for i, v in enumerate(values[: self.weights])}

    def _outer_step(self, averaged) -> List[np.ndarray]:
        """The outer step moves the weights; averaged optimizer slots stay averaged."""
        if not self.anchors:
            self._set_anchors(averaged)  # no warm-up: the weights were broadcast before the first update
            return averaged
        stepped = []
        for i, value in enumerate(averaged[: self.weights]):
            key = str(i)
            anchor = self.anchors[key]
            outer_gradient = anchor - value
            velocity = self.velocities.get(key)
            if velocity is None:
                velocity = self.velocities[key] = np.zeros_like(anchor)
            velocity *= self.outer_momentum
            velocity += outer_gradient
            anchor -= self.outer_lr * (outer_gradient + self.outer_momentum * velocity)
            stepped.append(anchor.copy())
        return stepped + list(averaged[self.weights :])

    # ---------------------------------------------------------------- state (elastic): shared by every rank

    def shared_state(self) -> dict:
        copy = lambda d: {k: np.array(v, copy=True) for k, v in d.items()}  # noqa: E731
        return {"steps": self.steps, "anchors": copy(self.anchors), "velocities": copy(self.velocities)}

    def state_dict(self) -> dict:
        return {"local": {}, "shared": self.shared_state()}

    def load_state_dict(self, state: dict) -> None:
        shared = state.get("shared")
        if shared is not None:
            self.steps = int(shared["steps"])
            self.anchors = {k: np.array(v, copy=True) for k, v in shared["anchors"].items()}
            self.velocities = {k: np.array(v, copy=True) for k, v in shared["velocities"].items()}
