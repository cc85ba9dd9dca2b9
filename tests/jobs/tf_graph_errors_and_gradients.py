"""Eagerly, in a tf.function and in a tf.Graph run by a tf.compat.v1.Session: Horovod's error classes, its
IndexedSlices reduction (integer Average, grouped with and without dense tensors, no pre/postscale), and the
gradients of broadcast, grouped allgather and grouped reducescatter (inputs of unknown rank in graphs)."""

import numpy as np
import tensorflow as tf
from tf_common import N, R, hvd, same


def three_ways(fn, *args, specs=()):
    """(mode, fn's results as numpy): eagerly, in a tf.function with input signature specs, and in a tf.Graph
    whose placeholders (of specs) a Session feeds with args."""
    to_np = lambda out: [t.numpy() for t in out]
    yield "eager", to_np(fn(*[tf.constant(a) for a in args]))
    yield "tf.function", to_np(tf.function(fn, input_signature=list(specs))(*args))
    with tf.Graph().as_default():
        placeholders = [tf.compat.v1.placeholder(s.dtype, s.shape) for s in specs]
        out = fn(*placeholders)
        with tf.compat.v1.Session() as session:
            yield "session", session.run(out, dict(zip(placeholders, args)))


def one_mode(mode, fn):
    """fn's results in one mode only (an error in a mode must not be raised by another)."""
    if mode == "eager":
        return [t.numpy() for t in fn()]
    if mode == "tf.function":
        return [t.numpy() for t in tf.function(fn)()]
    with tf.Graph().as_default():  # a graph per case: its collectives only
        out = fn()
        with tf.compat.v1.Session() as session:
            return session.run(out)


# 1. Error classes: mismatches are FailedPreconditionError (and hvd.MismatchError), bad arguments
# InvalidArgumentError (and hvd.InvalidArgumentError), in every mode; the next collective works.
cases = [
    (
        lambda m: [hvd.allreduce(tf.ones([2 + R]), name=f"shape_{m}")],
        tf.errors.FailedPreconditionError,
        hvd.MismatchError,
        "Mismatched shapes",
    ),
    (
        lambda m: [hvd.allreduce(tf.ones([2], tf.float32 if R == 0 else tf.float64), name=f"dtype_{m}")],
        tf.errors.FailedPreconditionError,
        hvd.MismatchError,
        "dtype_",
    ),
    (
        lambda m: [hvd.broadcast(tf.ones([2]), root_rank=R, name=f"root_{m}")],
        tf.errors.FailedPreconditionError,
        hvd.MismatchError,
        "root_",
    ),
    (
        lambda m: [hvd.broadcast(tf.ones([2]), root_rank=N + 5, name=f"no_root_{m}")],
        tf.errors.InvalidArgumentError,
        hvd.InvalidArgumentError,
        "root",
    ),
]
for mode in ("eager", "tf.function", "session"):
    for build, tf_class, hvd_class, text in cases:
        try:
            one_mode(mode, lambda: build(mode.replace(".", "_")))
        except tf_class as e:
            assert isinstance(e, hvd_class), (mode, text, type(e).__mro__)
            assert text in str(e), (mode, text, str(e))
        else:
            raise SystemExit(f"{mode}: {text} accepted")
    same(
        f"{mode} after errors", one_mode(mode, lambda: [hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)])[0], [float(N)]
    )


# 2. IndexedSlices: values and indices gathered; Average divides the values with `/`, as Horovod does (integer
# values become floats); grouped alone and mixed with dense tensors; no pre/postscale and no other op.
def sparse():
    ints = tf.IndexedSlices(tf.fill([R + 1, 2], R + 1), tf.range(R + 1), tf.constant([N, 2]))
    floats = tf.IndexedSlices(tf.fill([1, 3], 2.0 * (R + 1)), tf.constant([N - 1 - R]), tf.constant([N, 3]))
    dense = tf.constant([float(R), 2.0])
    a = hvd.allreduce(ints, op=hvd.Average)
    g = hvd.grouped_allreduce([ints, floats])
    m = hvd.grouped_allreduce([floats, dense, ints], op=hvd.Sum)
    return [
        a.values,
        a.indices,
        g[0].values,
        g[0].indices,
        g[1].values,
        g[1].indices,
        m[0].values,
        m[0].indices,
        m[1],
        m[2].values,
        m[2].indices,
    ]


int_values = np.concatenate([np.full([r + 1, 2], r + 1, np.int32) for r in range(N)])
int_indices = np.concatenate([np.arange(r + 1, dtype=np.int32) for r in range(N)])
float_values = np.array([[2.0 * (r + 1)] * 3 for r in range(N)], np.float32)
float_indices = np.array([N - 1 - r for r in range(N)], np.int32)
expected = [
    int_values / N,
    int_indices,
    int_values / N,
    int_indices,
    float_values / N,
    float_indices,
    float_values,
    float_indices,
    np.array([sum(range(N)), 2.0 * N], np.float32),
    int_values,
    int_indices,
]
for mode, got in three_ways(sparse):
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype, (mode, i, g.dtype, e.dtype)  # int32 / int32 is float64 in TensorFlow too
        same(f"{mode} sparse #{i}", g, e)


def refuses(fn, exc, text):
    try:
        fn()
    except exc as e:
        assert text in str(e), str(e)
    else:
        raise SystemExit(f"{text}: accepted")


slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([R]), tf.constant([N, 2]))
for wrap in (lambda f: f, tf.function):
    refuses(wrap(lambda: hvd.allreduce(slices, prescale_factor=2.0).values), NotImplementedError, "Pre/postscale")
    refuses(wrap(lambda: hvd.allreduce(slices, postscale_factor=0.5).values), NotImplementedError, "Pre/postscale")
    refuses(
        wrap(lambda: hvd.grouped_allreduce([tf.ones([2]), slices], postscale_factor=0.5)[0]),
        NotImplementedError,
        "Pre/postscale",
    )
    refuses(
        wrap(lambda: hvd.grouped_allreduce([slices], op=hvd.Max)[0].values), NotImplementedError, "Sum and Average"
    )
same("after refusals", hvd.allreduce(tf.constant([2.0]), op=hvd.Sum), [2.0 * N])  # nothing was left half-issued


# 3. Gradients in graphs: broadcast (the root gets the average, the others zeros), grouped allgather and grouped
# reducescatter, with inputs whose rank is unknown to the graph.
def d_broadcast(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(hvd.broadcast(x, root_rank=N - 1) * 2.0)
    return [tape.gradient(loss, x)]


for mode, (g,) in three_ways(
    d_broadcast, np.full([1, 2], R + 1.0, np.float32), specs=[tf.TensorSpec([1, 2], tf.float32)]
):
    same(f"{mode} d broadcast", g, np.full([1, 2], 2.0 if R == N - 1 else 0.0, np.float32))
total = sum(r + 1 for r in range(N))
coef = np.arange(total * 2, dtype=np.float32).reshape(total, 2)
offset = sum(r + 1 for r in range(R))


def d_grouped_allgather(x, z):
    with tf.GradientTape() as tape:
        tape.watch([x, z])
        gx, gz = hvd.grouped_allgather([x, z])
        loss = tf.reduce_sum(gx * coef) + tf.cast(tf.reduce_sum(gz * 3.0), tf.float32)
    return tape.gradient(loss, [x, z])


unknown = [tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.float64)]
for mode, (gx, gz) in three_ways(
    d_grouped_allgather, np.ones([R + 1, 2], np.float32), np.ones([3], np.float64), specs=unknown
):
    same(f"{mode} d grouped allgather x", gx, coef[offset : offset + R + 1])
    same(f"{mode} d grouped allgather z", gz, np.full([3], 3.0))


def d_grouped_reducescatter(y, w):
    with tf.GradientTape() as tape:
        tape.watch([y, w])
        ry, rw = hvd.grouped_reducescatter([y, w], op=hvd.Sum)
        loss = tf.reduce_sum(ry * 5.0) + tf.cast(tf.reduce_sum(rw), tf.float32)
    return tape.gradient(loss, [y, w])


for mode, (gy, gw) in three_ways(
    d_grouped_reducescatter, np.ones([2 * N, 2], np.float32), np.ones([N, 3], np.float64), specs=unknown
):
    same(f"{mode} d grouped reducescatter y", gy, np.full([2 * N, 2], 5.0 * N))  # Horovod: times N for Sum
    same(f"{mode} d grouped reducescatter w", gw, np.full([N, 3], 1.0 * N))
