"""What every Keras job of tests/test_keras.py shares: one TensorFlow thread, hvdlite joined, a small model, data
split into global batches, and a check that every rank holds the same values. Importing it joins the job."""

import numpy as np
import tensorflow as tf

# One thread each, set before anything starts TensorFlow's runtime: Keras and hvdlite are imported after it.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
B = 4  # rows per rank per step


def mlp(seed, width=16):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(3)])


def data(steps, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(steps * N * B, 6)).astype("float32"), rng.integers(0, 3, size=steps * N * B)


def shard(a, steps):
    """Rank R's rows of every global batch: global batch i is rows [i*N*B, (i+1)*N*B)."""
    idx = np.concatenate([np.arange(i * N * B + R * B, i * N * B + (R + 1) * B) for i in range(steps)])
    return a[idx]


def flat(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])


def assert_same_everywhere(values, what):
    everyone = hvd.allgather_object(values, name="check." + what)
    assert all(np.array_equal(e, values) for e in everyone), f"{what}: ranks differ"


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
