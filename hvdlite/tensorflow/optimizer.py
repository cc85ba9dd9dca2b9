"""hvdlite.tensorflow.DistributedOptimizer: Keras 3 optimizers are handed to
hvdlite.tensorflow.keras.DistributedOptimizer; tf.compat.v1.train optimizers (TF1 graphs, sessions, or eager
`minimize(callable)`) are wrapped so that compute_gradients returns reduced gradients.

backward_passes_per_step=N with a tf.compat.v1 optimizer follows Horovod's LocalGradientAggregationHelper:
compute_gradients adds this pass's gradients to local accumulators and returns them unreduced, except on every
N-th call, where it returns the accumulated gradients reduced over the ranks (divided by N with
average_aggregated_gradients); apply_gradients applies only on those calls and otherwise just advances
global_step. Unlike Horovod (graph mode only), this also works eagerly.
"""

import tensorflow as tf

from hvdlite.common.basics import global_process_set
from hvdlite.common.ops import Adasum, Average
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.gradients import GradientReducer, _var_key, check_gradient_op, resolve_groups


class _PassAccumulator:
    """Local sums of the gradients of N backward passes (dense), and the pass counter, for one optimizer."""

    def __init__(self, passes: int, average: bool, reducer: GradientReducer):
        self.passes, self.average, self.reducer = passes, average, reducer
        self.counter = None
        self.sums = {}  # var key -> accumulator variable

    @staticmethod
    def _local_zeros(shape, dtype, name):
        # Created outside any tf.function being traced (init_scope). Not trainable, not saved with the model;
        # in TF1 graphs a LOCAL variable, which MonitoredTrainingSession and
        # tf.compat.v1.local_variables_initializer() initialise.
        with tf.init_scope():
            return tf.compat.v1.Variable(
                tf.zeros(shape, dtype),
                trainable=False,
                name=name,
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            )

    def _prepare(self, grads, variables):
        if self.counter is None:
            self.counter = self._local_zeros([], tf.int64, "hvd_backward_passes")
        for g, v in zip(grads, variables):
            if g is not None and _var_key(v) not in self.sums:
                self.sums[_var_key(v)] = self._local_zeros(
                    v.shape, tf.as_dtype(v.dtype).base_dtype, "hvd_gradient_accumulator"
                )

    def compute(self, grads, variables):
        """Adds grads to the sums; returns the reduced sums on every N-th pass, else this pass's gradients."""
        self._prepare(grads, variables)
        dense = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        present = [i for i, g in enumerate(dense) if g is not None]
        sums = [self.sums[_var_key(variables[i])] for i in present]
        added = [s.assign_add(tf.cast(dense[i], s.dtype)) for s, i in zip(sums, present)]
        with tf.control_dependencies(added):
            count = self.counter.assign_add(1)

        def reduce_sums():
            totals = [s.read_value() for s in sums]
            if self.average:
                totals = [t / tf.cast(self.passes, t.dtype) for t in totals]
            reduced = self.reducer.reduce(totals, [variables[i] for i in present])
            with tf.control_dependencies(reduced):
                resets = [s.assign(tf.zeros_like(s)) for s in sums] + [self.counter.assign(0)]
            with tf.control_dependencies(resets):
                return [tf.identity(r) for r in reduced]

        def this_pass():
            return [tf.identity(dense[i]) for i in present]

        chosen = tf.cond(tf.equal(count, self.passes), reduce_sums, this_pass) if present else []
        results = [None] * len(grads)
        for i, value in zip(present, chosen if isinstance(chosen, (list, tuple)) else [chosen]):
            results[i] = value
        return results

    def apply(self, apply_fn, grads, global_step):
        """Runs apply_fn on the passes whose gradients were reduced (counter back at 0); otherwise advances
        global_step, as Horovod does, so that hooks counting steps see every pass."""

        def advance():
            if global_step is None:
                return tf.no_op()
            return tf.group(global_step.assign_add(tf.ones([], global_step.dtype.base_dtype)))

        if tf.executing_eagerly():
            return apply_fn() if int(self.counter.numpy()) == 0 else advance()
        with tf.control_dependencies([g for g in grads if g is not None]):  # after compute()'s counter update
            synced = tf.equal(self.counter.read_value(), 0)
        return tf.cond(synced, lambda: tf.group(apply_fn()), advance)


class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients reduces over the ranks; everything else is
    delegated to the wrapped optimizer."""

    def __init__(
        self, optimizer, name, use_locking, reducer, backward_passes_per_step=1, average_aggregated_gradients=False
    ):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = reducer
        self._accumulator = (
            _PassAccumulator(backward_passes_per_step, average_aggregated_gradients, reducer)
            if backward_passes_per_step > 1
            else None
        )

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        if self._accumulator is not None:
            return list(zip(self._accumulator.compute(list(grads), list(variables)), variables))
        return list(zip(self._reducer.reduce(grads, variables), variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if self._accumulator is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        grads_and_vars = list(grads_and_vars)
        return self._accumulator.apply(
            lambda: self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name),
            [g for g, _ in grads_and_vars],
            global_step,
        )

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)

    def register_local_var(self, var):
        """var's gradient stays local to this rank (not reduced); scaled by 1/size if scale_local_gradients."""
        self._reducer.register_local_var(var)


def DistributedOptimizer(
    optimizer,
    name=None,
    use_locking=False,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Wraps a Keras 3 optimizer (see hvdlite.tensorflow.keras.DistributedOptimizer) or a
    tf.compat.v1.train.Optimizer so that gradients are reduced (by default averaged) over the ranks of
    process_set. Checks and errors as in horovod.tensorflow.DistributedOptimizer."""
    import keras

    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    groups = resolve_groups(num_groups, groups)
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be > 0")

    if isinstance(optimizer, keras.optimizers.Optimizer):
        if op == Adasum:
            raise ValueError("op == Adasum is not supported yet with Keras")
        from hvdlite.tensorflow.keras.optimizer import DistributedOptimizer as KerasDistributedOptimizer

        return KerasDistributedOptimizer(
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
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        check_gradient_op(op, gradient_predivide_factor)
        if op == Adasum:
            raise NotImplementedError(
                "DistributedOptimizer(op=hvd.Adasum) is Horovod's delta-based Adasum optimizer, which hvdlite does "
                "not implement; DistributedGradientTape(op=hvd.Adasum) and hvd.allreduce(op=hvd.Adasum) reduce "
                "gradients with Adasum"
            )
        name = name or f"Distributed{type(optimizer).__name__}"
        reducer = GradientReducer(
            name,
            compression,
            op,
            sparse_as_dense,
            gradient_predivide_factor,
            process_set,
            groups,
            scale_local_gradients,
        )
        return _DistributedV1Optimizer(
            optimizer, name, use_locking, reducer, backward_passes_per_step, average_aggregated_gradients
        )
    raise ValueError(
        f"DistributedOptimizer takes a Keras 3 optimizer or a tf.compat.v1.train.Optimizer, got "
        f"{type(optimizer).__name__}; for a custom training loop use DistributedGradientTape"
    )
