"""The gradients of the collectives, the errors of mismatched inputs on every rank, and XLA's refusal."""

import numpy as np
import tensorflow as tf
from tf_common import MODES, N, R, hvd, run, same

for mode in MODES:

    def grads(fn, x):
        def inner():
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
            return tape.gradient(y, x)

        return run(mode, inner)

    x = tf.constant(np.arange(4, dtype=np.float64) + R)
    w = np.arange(4, dtype=np.float64) + 1
    same(f"{mode} d allreduce sum", grads(lambda x: tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum) * w), x), w * N)
    same(f"{mode} d allreduce avg", grads(lambda x: tf.reduce_sum(hvd.allreduce(x) * w), x), w, 1e-12)
    g = grads(lambda x: tf.reduce_sum(hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)[1] * w), x)
    same(f"{mode} d grouped allreduce", g, 2 * w * N)
    a = tf.ones([R + 1, 2], tf.float64)
    total = sum(r + 1 for r in range(N))
    coef = np.arange(total * 2, dtype=np.float64).reshape(total, 2)
    offset = sum(r + 1 for r in range(R))
    same(
        f"{mode} d allgather",
        grads(lambda a: tf.reduce_sum(hvd.allgather(a) * coef), a),
        coef[offset : offset + R + 1],
    )  # Horovod averages the gradient over the set (torch.distributed.nn sums)
    b = tf.ones([3], tf.float64)
    same(
        f"{mode} d broadcast",
        grads(lambda b: tf.reduce_sum(hvd.broadcast(b, root_rank=1) * 2), b),
        np.full(3, 2.0 if R == 1 else 0.0),
    )  # averaged onto the root
    t = tf.constant(np.arange(2 * N, dtype=np.float64))
    coef2 = np.arange(2 * N, dtype=np.float64) + 1
    # alltoall's gradient sends the output gradient back: rank r's rows 2k, 2k+1 went to rank k, position 2r, 2r+1
    expected = np.concatenate([[2 * R + 1, 2 * R + 2] for k in range(N)]).astype(np.float64)
    same(f"{mode} d alltoall", grads(lambda t: tf.reduce_sum(hvd.alltoall(t) * coef2), t), expected)
    s = tf.ones([2 * N, 3], tf.float64)
    same(
        f"{mode} d reducescatter sum",
        grads(lambda s: tf.reduce_sum(hvd.reducescatter(s, op=hvd.Sum) * 5), s),
        np.full((2 * N, 3), 5.0 * N),
    )  # Horovod: times the set size for Sum
    same(
        f"{mode} d reducescatter avg",
        grads(lambda s: tf.reduce_sum(hvd.reducescatter(s) * 5), s),
        np.full((2 * N, 3), 5.0),
        1e-12,
    )

# Errors: a shape mismatch fails on every rank with the core's message, as a TensorFlow error; the next
# collective works.
bad = tf.ones([2 + R])
try:
    hvd.allreduce(bad, name="mismatched")
except tf.errors.FailedPreconditionError as e:
    assert isinstance(e, hvd.MismatchError) and isinstance(e, hvd.HorovodInternalError), type(e).__mro__
    assert "Mismatched shapes for tensor 'mismatched'" in str(e), str(e)
else:
    raise SystemExit("eager mismatch accepted")
try:
    tf.function(lambda: hvd.allgather(tf.ones([1, 2 + R]), name="mismatched_graph"))()
except tf.errors.FailedPreconditionError as e:
    # inside tf.function too, the class is hvdlite's (not TensorFlow's generic UnknownError)
    assert isinstance(e, hvd.MismatchError) and isinstance(e, hvd.HorovodInternalError), type(e).__mro__
    assert "Mismatched shapes beyond the first dimension for tensor 'mismatched_graph'" in str(e), str(e)
else:
    raise SystemExit("graph mismatch accepted")
same("after errors", hvd.allreduce(tf.constant([1.0]), op=hvd.Sum), [float(N)])
try:
    hvd.allreduce(tf.ones([2], tf.complex64))
except tf.errors.InvalidArgumentError as e:
    assert "complex64" in str(e) and "not support" in str(e), str(e)
else:
    raise SystemExit("complex64 accepted")
try:
    hvd.broadcast(tf.constant([1.0]), root_rank=N + 5, name="badroot")
except tf.errors.OpError as e:
    assert "root" in str(e).lower(), str(e)
else:
    raise SystemExit("bad root accepted")
same("after bad root", hvd.allreduce(tf.constant([2.0]), op=hvd.Sum), [2.0 * N])
# XLA cannot call the core: a clear error at trace time, never an unsynchronised result
try:
    tf.function(lambda: hvd.allreduce(tf.ones([2])), jit_compile=True)()
except hvd.XlaCompilationError as e:
    assert "jit_compile" in str(e) and isinstance(e, tf.errors.UnimplementedError)
else:
    raise SystemExit("allreduce under XLA accepted")
# Adasum of parallel gradients is their mean (tests/test_adasum.py checks the general case)
same("adasum", hvd.allreduce(tf.fill([3], float(R + 1)), op=hvd.Adasum), [(N + 1) / 2.0] * 3)
