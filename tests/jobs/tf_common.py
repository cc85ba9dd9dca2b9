"""What the TensorFlow jobs of tests/test_tensorflow.py share: one TensorFlow thread, hvdlite joined, and running a
function eagerly or as a tf.function. Importing it joins the job."""

import numpy as np
import tensorflow as tf

# One thread each, set before anything starts TensorFlow's runtime.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import hvdlite.tensorflow as hvd  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
MODES = ("eager", "graph")


def run(mode, fn):
    """fn() eagerly, or traced into a tf.function and called; results as numpy (nested lists/tuples kept)."""
    out = fn() if mode == "eager" else tf.function(fn)()
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)


def same(what, got, expected, atol=0.0):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if atol:
        close = np.allclose(got.astype(np.float64), expected.astype(np.float64), atol=atol)
        assert close, f"{what}: {got} != {expected}"
    else:
        assert np.array_equal(got, expected), f"{what}: {got} != {expected}"
