"""Horovod's Keras semantics on hvdlite.tensorflow.keras. argv[1]: a folder for files."""

import os
import sys

import keras
import numpy as np
import tensorflow as tf
from horovod_tf_common import N, R, Recorder, close, hvd, raises, warns

import hvdlite.tensorflow.keras as hvd_keras

TMP = sys.argv[1]
mean_r1 = np.mean([r + 1.0 for r in range(N)])

# module-level functions: default op Average; build and backend flags re-exported
close("keras allreduce", hvd_keras.allreduce([float(R), 1.0]), [np.mean(range(N)), 1.0])
close("keras reducescatter", hvd_keras.reducescatter(np.ones((N, 1), np.float32) * R), [[np.mean(range(N))]])
assert hvd_keras.cuda_built() is False and hvd_keras.gloo_built() is True and hvd_keras.rocm_built() is False
assert isinstance(hvd_keras.mpi_built(), bool) and isinstance(hvd_keras.nccl_built(), bool)


def variables():
    return [tf.Variable([0.0, 0.0]), tf.Variable([0.0])]


def apply_passes(opt, vs, passes, graph=False):
    """pass p: every gradient is (R + 1) * (p + 1)"""

    def apply(p):
        opt.apply_gradients([(tf.ones_like(v) * (R + 1.0) * tf.cast(p + 1, tf.float32), v) for v in vs])

    apply = tf.function(apply) if graph else apply
    for p in range(passes):
        apply(tf.constant(p))


# Horovod's Keras optimizer: op Average or Sum only; gradient_predivide_factor acts with Average only
raises(
    ValueError,
    lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd_keras.Min),
    "op currently only supports Average and Sum",
)
for kwargs, factor in (
    ({}, mean_r1),
    ({"op": hvd_keras.Sum}, N * mean_r1),
    ({"op": hvd_keras.Sum, "gradient_predivide_factor": 4.0}, N * mean_r1),
    ({"gradient_predivide_factor": 4.0}, mean_r1),
):
    vs = variables()
    apply_passes(hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), **kwargs), vs, 1)
    close(f"keras {kwargs}", vs[0], [-factor] * 2)

# backward_passes_per_step: sum (or average) of the passes, reduced and applied on every N-th; iterations
# count every pass. Through both entry points, eagerly and in a tf.function.
for make in (hvd_keras.DistributedOptimizer, hvd.DistributedOptimizer):
    for average in (False, True):
        for graph in (False, True):
            vs = variables()
            opt = make(keras.optimizers.SGD(1.0), backward_passes_per_step=3, average_aggregated_gradients=average)
            apply_passes(opt, vs, 2, graph)
            close("before the 3rd pass", vs[1], [0.0])
            apply_passes(opt, vs, 1, graph)  # pass index 0 again: (R + 1) * 1
            total = (1 + 2 + 1) * mean_r1 / (3.0 if average else 1.0)
            close(f"passes average={average} graph={graph}", vs[1], [-total], atol=1e-5)
            assert int(opt.iterations.numpy()) == 3

# groups: a list of variable lists, and the deprecated num_groups
vs = variables()
with Recorder() as rec:
    apply_passes(hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), groups=[[vs[1]]]), vs, 1)
assert [name for name, _ in rec.calls[0]] == ["DistributedSGD.v0.float32", "DistributedSGD.g0.float32"], rec.calls
close("keras groups", vs[0], [-mean_r1] * 2)
warns(DeprecationWarning, lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), num_groups=2))
raises(
    ValueError,
    lambda: hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[object()]),
    "tf.keras.layers.Layer",
)

# BestModelCheckpoint: the best model by the monitored value; the path may be assigned after construction
keras.utils.set_random_seed(R)
rng = np.random.default_rng(0)
xs, ys = rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")
vx, vy = rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")


def regression():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
    return model


class Weights(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.per_epoch, self.val_loss = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.per_epoch.append([w.copy() for w in self.model.get_weights()])
        self.val_loss.append(logs["val_loss"])


for weights_only in (False, True):
    model, record = regression(), Weights()
    best = hvd_keras.callbacks.BestModelCheckpoint(monitor="val_loss", save_weights_only=weights_only)
    assert best.save_best_only
    best.filepath = os.path.join(TMP, f"best{R}" + (".weights.h5" if weights_only else ".keras"))
    model.fit(
        xs,
        ys,
        epochs=6,
        batch_size=8,
        validation_data=(vx, vy),
        verbose=0,
        shuffle=False,
        callbacks=[hvd_keras.callbacks.MetricAverageCallback(), best, record],
    )
    wanted = record.per_epoch[int(np.argmin(record.val_loss))]
    if weights_only:
        restored = regression()
        restored.load_weights(best.filepath)
    else:
        restored = keras.models.load_model(best.filepath)
    for got, expected in zip(restored.get_weights(), wanted):
        close("best model", got, expected)
raises(
    ValueError,
    lambda: regression().fit(xs, ys, epochs=1, verbose=0, callbacks=[hvd_keras.callbacks.BestModelCheckpoint()]),
    "filepath",
)
