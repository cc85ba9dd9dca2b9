"""hvdlite.tensorflow.DistributedOptimizer: Keras 3 optimizers are handed to
hvdlite.tensorflow.keras.DistributedOptimizer; tf.compat.v1.train optimizers (TF1 graphs, sessions, or eager
`minimize(callable)`) are wrapped so that compute_gradients returns averaged gradients."""
import tensorflow as tf

from hvdlite.common.basics import global_process_set
from hvdlite.common.ops import Average
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.gradients import GradientReducer


class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients averages over the ranks; everything else is
    delegated to the wrapped optimizer."""

    def __init__(self, optimizer, name, use_locking, reducer):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = reducer

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        return list(zip(self._reducer.reduce(grads, variables), variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)

    def register_local_var(self, var):
        self._reducer.register_local_var(var)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras 3 optimizer (see hvdlite.tensorflow.keras.DistributedOptimizer) or a
    tf.compat.v1.train.Optimizer so that gradients are averaged over the ranks of process_set."""
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        from hvdlite.tensorflow.keras.optimizer import DistributedOptimizer as KerasDistributedOptimizer

        return KerasDistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                         gradient_predivide_factor, op, backward_passes_per_step,
                                         average_aggregated_gradients, num_groups, groups, process_set,
                                         scale_local_gradients)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise ValueError("backward_passes_per_step > 1 is supported for Keras optimizers; with a "
                             "tf.compat.v1.train optimizer, accumulate the gradients before apply_gradients")
        name = name or f"Distributed{type(optimizer).__name__}"
        reducer = GradientReducer(name, compression, op, sparse_as_dense, gradient_predivide_factor, process_set,
                                  num_groups, groups, scale_local_gradients)
        return _DistributedV1Optimizer(optimizer, name, use_locking, reducer)
    raise ValueError(f"DistributedOptimizer takes a Keras 3 optimizer or a tf.compat.v1.train.Optimizer, got "
                     f"{type(optimizer).__name__}; for a custom training loop use DistributedGradientTape")
