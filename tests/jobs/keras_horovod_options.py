"""Horovod options that meet Keras 3: BroadcastGlobalVariablesCallback's local_variables,
SyncBatchNormalization's fused, PartialDistributedGradientTape on Keras layers (eagerly and in a
tf.function), and horovod.tensorflow's _executing_eagerly."""

import keras
import numpy as np
import tensorflow as tf
from keras_common import LOSS, B, N, R, data, hvd, shard

import hvdlite.tensorflow as hvd_tf

# BroadcastGlobalVariablesCallback(root_rank, local_variables=...): those variables keep each rank's value; a
# Keras variable may be given as itself or as the TensorFlow variable it holds.
keras.utils.set_random_seed(10 + R)  # a different initialisation on every rank
shared, local = keras.layers.Dense(4, name="shared"), keras.layers.Dense(3, name="local")
model = keras.Sequential([keras.Input((6,)), shared, local])
model.compile(optimizer=keras.optimizers.SGD(0.0), loss=LOSS)  # learning rate 0: only the broadcast changes weights
initial = {v.path: v.numpy() for v in model.weights}
root = hvd.broadcast_object(initial, root_rank=0, name="initial")
x, y = data(1)
callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local.kernel, local.bias.value])
model.fit(shard(x, 1), shard(y, 1), batch_size=B, epochs=1, verbose=0, callbacks=[callback])
for v in model.weights:
    expected = initial[v.path] if any(v is w for w in local.weights) else root[v.path]
    assert np.array_equal(v.numpy(), expected), v.path
assert R == 0 or not np.array_equal(local.kernel.numpy(), root[local.kernel.path])
assert hvd.callbacks.BroadcastGlobalVariablesCallback(0, "", local.kernel).local_variables == [local.kernel]

# SyncBatchNormalization: Keras 3 has no fused kernel; fused=False and None (Keras 2's default) are accepted, also
# from a saved config; fused=True is refused as in Horovod.
batch = tf.constant(np.arange(8 * 3, dtype=np.float32).reshape(8, 3) * (R + 1))
for fused in (False, None):
    layer = hvd.SyncBatchNormalization(fused=fused)
    assert layer(batch, training=True).shape == (8, 3)
    assert hvd.SyncBatchNormalization.from_config(dict(layer.get_config(), fused=fused)) is not None
try:
    hvd.SyncBatchNormalization(fused=True)
except ValueError as e:
    assert "fused=True" in str(e)
else:
    raise SystemExit("fused=True accepted")

# PartialDistributedGradientTape with Keras 3 layers: the local layer's gradient stays local (divided by the
# number of ranks, scale_local_gradients), the others are averaged; eagerly and in a tf.function.
features = tf.constant(shard(x, 1))


def loss_fn():
    return tf.reduce_sum(model(features) ** 2)


with tf.GradientTape() as tape:
    loss = loss_fn()
plain = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
everyone = hvd.allgather_object(plain, name="plain gradients")
for graph in (False, True):

    def distributed():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        tape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=[local])
        return tape.gradient(loss, model.trainable_variables)

    got = (tf.function(distributed) if graph else distributed)()
    for i, (v, g) in enumerate(zip(model.trainable_variables, got)):
        if any(v is w for w in local.weights):
            expected = plain[i] / N
        else:
            expected = np.mean([e[i] for e in everyone], axis=0)
        assert np.allclose(g.numpy(), expected, atol=1e-5), (graph, v.path)

# horovod.tensorflow._executing_eagerly
assert hvd_tf._executing_eagerly() is True
assert not tf.function(lambda: tf.constant(hvd_tf._executing_eagerly()))().numpy()
