"""DistributedOptimizer for Keras 3 (keras 3.x on the TensorFlow backend).

Keras 3 applies gradients through `Optimizer.apply(grads, trainable_variables)`: `apply_gradients` calls it,
`model.fit`'s train step calls it (inside a tf.function, inside a tf.while_loop when steps_per_execution > 1),
and LossScaleOptimizer calls its inner optimizer's. Horovod's Keras 2 hooks (`get_gradients`,
`_aggregate_gradients`) do not exist any more, which is why Horovod's wrapper silently trains each rank alone on
Keras 3 (horovod#4290).

The wrapped optimizer keeps its object (variables, hyper-parameters, iteration count): its class becomes a
subclass of the original one, named and placed like it (same __name__, __qualname__, __module__), whose
`apply` first averages the gradients over the ranks (one fused buffer per dtype, see
hvdlite/tensorflow/gradients.py) and then runs the original `apply`: clipping, weight decay, loss-scale
unscaling and the update all see the global gradient, as in a single process on the global batch. Nothing
hvdlite-specific is tracked or serialised, so a model saved with it reloads with plain Keras.

Wrapping a LossScaleOptimizer (explicitly, or automatically under the mixed_float16 policy) puts the allreduce
before its finiteness check: every rank sees the same reduced gradients, so all skip an overflowing step
together instead of one rank skipping a collective the others wait for.
"""

import keras
import tensorflow as tf

from hvdlite.common.basics import global_process_set
from hvdlite.common.ops import Average, Sum
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.error_feedback import ErrorFeedbackSpec
from hvdlite.tensorflow.gradients import GradientReducer, _var_key, local_layers_list, resolve_groups
from hvdlite.tensorflow.keras.local_sgd import LocalSGD
from hvdlite.tensorflow.keras.staleness import StaleExchange


class _HvdState:
    """Everything hvdlite adds to an optimizer; stored outside Keras/TF tracking (never saved)."""

    def __init__(
        self,
        reducer: GradientReducer,
        backward_passes_per_step: int = 1,
        average_aggregated_gradients: bool = False,
        staleness=None,
        feedback=None,
        local_sgd=None,
    ):
        self.reducer = reducer
        self.stale = None if staleness is None else StaleExchange(staleness, reducer)
        self.feedback = feedback  # PowerSGD or top-k (error_feedback), else None
        self.local_sgd = local_sgd  # periodic parameter averaging (local_sgd), else None
        self.variables = None  # what apply() was last given, for drain()
        self.passes = backward_passes_per_step
        self.average_aggregated = average_aggregated_gradients
        self.accumulators = None  # var key -> tf.Variable, when backward_passes_per_step > 1
        self.counter = None


class _DistributedOptimizer:
    """Mixin placed in front of the wrapped Keras optimizer's class (see DistributedOptimizer)."""

    def _hvd(self) -> _HvdState:
        state = self.__dict__.get("_hvd_state")
        if state is None:  # an instance made from this class directly (e.g. from_config): default settings
            state = self.__dict__["_hvd_state"] = _HvdState(GradientReducer(f"Distributed{type(self).__name__}"))
        return state

    def register_local_var(self, var) -> None:
        """var's gradient stays local to this rank (not reduced); scaled by 1/size if scale_local_gradients."""
        self._hvd().reducer.register_local_var(var)

    def build(self, variables):
        super().build(variables)
        self._hvd_make_accumulators(variables)

    def _hvd_make_accumulators(self, variables) -> None:
        state = self._hvd()
        if state.passes == 1 or state.accumulators is not None:
            return
        with tf.init_scope():
            state.accumulators = {
                _var_key(v): tf.Variable(
                    tf.zeros(v.shape, dtype=tf.as_dtype(v.dtype)), trainable=False, name="hvd_gradient_accumulator"
                )
                for v in variables
            }
            state.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvd_backward_passes")

    def apply(self, grads, trainable_variables=None):
        state = self._hvd()
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            if not self.built:
                return super().apply(grads, trainable_variables)  # raises Keras's own error
            variables = list(getattr(self, "_trainable_variables", None) or self.inner_optimizer._trainable_variables)
        else:
            trainable_variables = list(trainable_variables)
            variables = trainable_variables
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
                self.built = True
        if state.passes == 1:
            return self._hvd_reduce_and_apply(grads, variables, trainable_variables, super().apply)
        return self._hvd_accumulate(grads, variables, trainable_variables, super().apply)

    def _hvd_reduce_and_apply(self, grads, variables, trainable_variables, parent_apply):
        state = self._hvd()
        if state.local_sgd is not None:
            if state.reducer.local_vars:
                raise ValueError("sync_every (local SGD) cannot be combined with local layers")
            return state.local_sgd.apply(
                self, grads, variables, trainable_variables, state.reducer.reduce, parent_apply
            )
        if state.feedback is not None:
            if state.reducer.local_vars:
                raise ValueError(f"Compression.{state.feedback.kind} cannot be combined with local layers")
            return parent_apply(state.feedback.apply(grads, variables), trainable_variables)
        if state.stale is None:
            return parent_apply(state.reducer.reduce(grads, variables), trainable_variables)
        state.variables = (variables, trainable_variables)
        state.stale.apply(grads, variables, trainable_variables, parent_apply)

    def drain(self) -> int:
        """With staleness=s: waits for the averages still in flight and applies each, oldest first (call it
        eagerly, e.g. after model.fit, before evaluating or saving); returns how many it applied."""
        state = self._hvd()
        if state.stale is None or state.variables is None:
            return 0
        variables, trainable_variables = state.variables
        applied = 0
        for averages in state.stale.drain():
            grads = [tf.cast(tf.constant(a), v.dtype) for a, v in zip(averages, variables)]
            super().apply(grads, trainable_variables)
            applied += 1
        return applied

    def _hvd_accumulate(self, grads, variables, trainable_variables, parent_apply):
        """backward_passes_per_step > 1: sum gradients locally, reduce and apply every N-th call."""
        state = self._hvd()
        self._hvd_make_accumulators(variables)
        accumulators = [None if g is None else state.accumulators[_var_key(v)] for g, v in zip(grads, variables)]
        for g, acc in zip(grads, accumulators):
            if acc is not None:
                acc.assign_add(tf.cast(tf.convert_to_tensor(g), acc.dtype))
        count = state.counter.assign_add(1)
        passes = state.passes

        def reduce_and_apply():
            summed = [None if acc is None else acc.read_value() for acc in accumulators]
            if state.average_aggregated:
                summed = [None if s is None else s / tf.cast(passes, s.dtype) for s in summed]
            self._hvd_reduce_and_apply(summed, variables, trainable_variables, parent_apply)
            for acc in accumulators:
                if acc is not None:
                    acc.assign(tf.zeros_like(acc))

        def skip():
            # Horovod counts every backward pass in optimizer.iterations.
            getattr(self, "inner_optimizer", self)._iterations.assign_add(1)

        tf.cond(tf.equal(count % passes, 0), reduce_and_apply, skip)


_classes = {}


def _distributed_class(base):
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type(
            base.__name__,
            (_DistributedOptimizer, base),
            {"__module__": base.__module__, "__qualname__": base.__qualname__},
        )
    return cls


def DistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
    staleness=None,
    sync_every=None,
    sync_warmup_steps=0,
    outer_lr=1.0,
    outer_momentum=0.0,
    average_optimizer_state=False,
):
    """Returns optimizer, now averaging gradients over the ranks of process_set before every update
    (horovod.tensorflow.keras.DistributedOptimizer's signature, for Keras 3).

    backward_passes_per_step=N sums gradients locally over N calls and reduces/applies on every N-th (divided
    by N if average_aggregated_gradients). Under the mixed_float16 global policy the optimizer is first wrapped
    in a LossScaleOptimizer (as model.compile would), so that the allreduce precedes its overflow check.
    As in Horovod's Keras optimizer, op is Average or Sum, and gradient_predivide_factor only acts with Average.

    staleness=s (hvdlite's own, s >= 1) starts each update's allreduce without waiting and applies its average s
    updates later (hvdlite.tensorflow.keras.staleness); the first s updates apply nothing and drain() applies
    the last s.

    compression=Compression.powersgd(...) or Compression.topk(...) (hvdlite's own, as in hvdlite.torch) reduces
    matrix-shaped gradients compressed, with error feedback (hvdlite.tensorflow.error_feedback).

    sync_every=k (hvdlite's own, as in hvdlite.torch) turns on local SGD (hvdlite.tensorflow.keras.local_sgd):
    after sync_warmup_steps synchronous updates each rank applies its own gradients and the weights (with
    average_optimizer_state, also the optimizer's slots shaped like them) are averaged every k updates; outer_lr
    and outer_momentum apply the averaged change through an outer Nesterov SGD step.
    """
    if op != Average and op != Sum:
        raise ValueError("op currently only supports Average and Sum")
    groups = resolve_groups(num_groups, groups)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"hvdlite.tensorflow.keras.DistributedOptimizer takes a Keras 3 optimizer "
            f"(keras.optimizers.*), got {type(optimizer).__name__}; for tf.compat.v1.train "
            "optimizers use hvdlite.tensorflow.DistributedOptimizer"
        )
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    if keras.mixed_precision.global_policy().name == "mixed_float16" and not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    base = type(optimizer)
    local_sgd = None
    if sync_every is not None:
        if op != Average:
            raise ValueError("sync_every (local SGD) averages weights: it needs op=Average")
        for other, given in (
            ("staleness", staleness is not None),
            (repr(compression), isinstance(compression, ErrorFeedbackSpec)),
        ):
            if given:
                raise ValueError(f"sync_every (local SGD) and {other} cannot be combined")
        local_sgd = LocalSGD(
            name or f"Distributed{base.__name__}",
            process_set,
            sync_every,
            sync_warmup_steps,
            outer_lr,
            outer_momentum,
            average_optimizer_state,
        )
    feedback = None
    if isinstance(compression, ErrorFeedbackSpec):
        if staleness is not None:
            raise ValueError(f"staleness cannot be combined with {compression!r}")
        if gradient_predivide_factor != 1.0:
            raise ValueError(f"gradient_predivide_factor cannot be combined with {compression!r}")
        feedback = compression.build(name or f"Distributed{base.__name__}", op, process_set)
        compression = Compression.none
    reducer = GradientReducer(
        name or f"Distributed{base.__name__}",
        compression,
        op,
        sparse_as_dense,
        gradient_predivide_factor,
        process_set,
        groups,
        scale_local_gradients,
    )
    optimizer.__class__ = _distributed_class(base)
    optimizer.__dict__["_hvd_state"] = _HvdState(
        reducer, backward_passes_per_step, average_aggregated_gradients, staleness, feedback, local_sgd
    )
    if optimizer.built:
        optimizer._hvd_make_accumulators(
            list(getattr(optimizer, "_trainable_variables", None) or optimizer.inner_optimizer._trainable_variables)
        )
    return optimizer


def PartialDistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients=True,
):
    """DistributedOptimizer whose local_layers' (a layer or list of layers) trainable weights keep their local
    gradients."""
    layers = local_layers_list(local_layers)
    optimizer = DistributedOptimizer(
        optimizer,
        name,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        gradient_predivide_factor,
        op,
        backward_passes_per_step,
        average_aggregated_gradients,
        0,
        groups,
        process_set,
        scale_local_gradients,
    )
    for layer in layers:
        for v in layer.trainable_weights:
            optimizer.register_local_var(v)
    return optimizer
