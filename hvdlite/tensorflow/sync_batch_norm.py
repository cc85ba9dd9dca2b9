"""SyncBatchNormalization: Keras 3 batch normalisation whose training statistics cover the global batch."""

import keras
import tensorflow as tf

from hvdlite.common.basics import global_process_set
from hvdlite.common.ops import Sum
from hvdlite.tensorflow import mpi_ops


@keras.saving.register_keras_serializable(package="hvdlite")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose batch mean and variance (in training) are computed over every rank's batch:
    each rank's sum, sum of squares and count travel in one allreduce, which is differentiable, so the backward
    pass also accounts for the other ranks' use of the statistics (horovod.tensorflow.SyncBatchNormalization).
    Moving statistics and inference are as in BatchNormalization."""

    def __init__(self, *args, fused=False, process_set=global_process_set, **kwargs):
        # Horovod's layer takes `fused` (Keras 2) and refuses the fused kernel, which cannot be synchronised.
        # Keras 3 has no fused kernel and no such argument: False, and None (Keras 2's "fused when possible"),
        # can only mean the computation below, so they are accepted and not passed on.
        if fused not in (False, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        super().__init__(*args, **kwargs)
        self.process_set = process_set

    def _moments(self, inputs, mask):
        inputs = tf.convert_to_tensor(inputs)
        axes = list(self._reduction_axes)
        if mask is None:
            total = tf.reduce_sum(inputs, axis=axes)
            squares = tf.reduce_sum(tf.square(inputs), axis=axes)
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), inputs.dtype)
            count = tf.reshape(count, [1])
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(inputs)), inputs.dtype)
            total = tf.reduce_sum(inputs * weights, axis=axes)
            squares = tf.reduce_sum(tf.square(inputs) * weights, axis=axes)
            count = tf.reduce_sum(weights, axis=axes)
        name = f"SyncBatchNormalization.{self.name}"
        total, squares, count = mpi_ops._grouped_allreduce_raw(
            [total, squares, count],
            [f"{name}.sum", f"{name}.squares", f"{name}.count"],
            Sum,
            1.0,
            1.0,
            self.process_set,
            "SyncBatchNormalization",
            f"{name}.packed",
        )
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        return mean, variance
