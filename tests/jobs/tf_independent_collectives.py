"""Collectives with no data dependency between them, evaluated together: eagerly, in a tf.function, and in a
tf.Graph run by a tf.compat.v1.Session with several inter-op threads, where TensorFlow may start them in any
order on each rank (each waits for its peers while holding a thread)."""

import numpy as np
import tensorflow as tf
from tf_common import N, R, hvd, same

DTYPES = (tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.float32, tf.float64)
SHAPES = ((3,), (2, 3), (2, 1, 2))


def value(dtype, shape, r, rows=None):
    shape = shape if rows is None else (rows,) + shape[1:]
    return ((np.arange(int(np.prod(shape))) % 5) + r).reshape(shape).astype(dtype.as_numpy_dtype)


def build(kind, scale=None):
    """21 independent collectives of one kind (7 dtypes x 3 shapes) and their expected results."""
    outs, expected = [], []
    for dtype in DTYPES:
        for shape in SHAPES:

            def x(v):
                t = tf.constant(v)
                return t if scale is None else t * tf.cast(scale, dtype)

            if kind == "allreduce":
                outs.append(hvd.allreduce(x(value(dtype, shape, R)), op=hvd.Sum))
                expected.append(sum(value(dtype, shape, r) for r in range(N)))
            elif kind == "allgather":  # rank r contributes r + 1 rows
                outs.append(hvd.allgather(x(value(dtype, shape, R, rows=R + 1))))
                expected.append(np.concatenate([value(dtype, shape, r, rows=r + 1) for r in range(N)]))
            else:  # reducescatter: 2 rows per rank
                outs.append(hvd.reducescatter(x(value(dtype, shape, R, rows=2 * N)), op=hvd.Sum))
                expected.append(sum(value(dtype, shape, r, rows=2 * N) for r in range(N))[2 * R : 2 * R + 2])
    return outs, expected


def check(what, got, expected):
    assert len(got) == len(expected) == 21
    for i, (g, e) in enumerate(zip(got, expected)):
        same(f"{what} #{i}", np.asarray(g).astype(np.float64), e.astype(np.float64))


KINDS = ("allreduce", "allgather", "reducescatter")
for kind in KINDS:
    got, expected = build(kind)
    check(f"eager {kind}", [t.numpy() for t in got], expected)
    check(f"tf.function {kind}", [t.numpy() for t in tf.function(lambda: build(kind)[0])()], expected)

config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
graph = tf.Graph()
with graph.as_default():
    built = {kind: build(kind) for kind in KINDS}
    scale = tf.compat.v1.placeholder(tf.float32, [])
    fed = {kind: build(kind, scale) for kind in KINDS}  # every collective reads the same placeholder
    with tf.compat.v1.Session(config=config) as session:
        for kind in KINDS:
            check(f"session {kind}", session.run(built[kind][0]), built[kind][1])
        everything = session.run({kind: fed[kind][0] for kind in KINDS}, feed_dict={scale: 1.0})
        for kind in KINDS:
            check(f"session fed {kind}", everything[kind], fed[kind][1])

# The ordering never makes a collective need another one's feed: `later` runs without `other`'s placeholder.
graph = tf.Graph()
with graph.as_default():
    other = tf.compat.v1.placeholder(tf.float32, [2])
    fed_sum = hvd.allreduce(other, op=hvd.Sum)
    later = hvd.allreduce(tf.constant([float(R)]), op=hvd.Sum)
    with tf.compat.v1.Session(config=config) as session:
        same("run alone", session.run(later), [float(sum(range(N)))])
        same("fed", session.run(fed_sum, feed_dict={other: [1.0, R]}), [float(N), float(sum(range(N)))])
