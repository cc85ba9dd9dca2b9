"""A bridge call site run step after step (hvdlite.tensorflow.bridge.CallSite): TensorFlow hands it new buffers
every call, and it must reduce into the right ones, keep nothing per buffer, follow a change of shape, and report a
member's error by name on every rank and stay usable."""

import threading

import numpy as np
import tensorflow as tf
from tf_common import N, R, hvd, same

from hvdlite.common import ops
from hvdlite.tensorflow import bridge

STEPS = 40
expected_sum = sum(range(1, N + 1))


# 1. A fused in-place allreduce whose input TensorFlow allocates anew each step (a gradient buffer), and a
# grouped out-of-place allreduce of three dtypes: right values every step, and the request cache does not grow.
@tf.function
def step(k):
    scale = tf.cast(k + 1, tf.float32) * float(R + 1)
    fused = tf.concat([tf.fill([300], scale), tf.fill([7], -scale)], 0)
    (reduced,) = bridge.call(
        [bridge.Collective(bridge.OP_ALLREDUCE, "site.fused", ops.core_reduce_op(hvd.Sum), in_place=True)],
        [fused],
        [tf.float32],
        [fused.shape],
    )
    grouped = hvd.grouped_allreduce(
        [tf.fill([5], scale), tf.cast(tf.fill([2, 3], k + R), tf.int32), tf.cast(tf.fill([4], scale), tf.float64)],
        op=hvd.Sum,
        name="site.grouped",
    )
    return reduced, grouped


held = None
cache_size = None
for k in range(STEPS):
    reduced, grouped = step(tf.constant(k))
    total = float((k + 1) * expected_sum)
    same(f"fused step {k}", reduced.numpy(), np.array([total] * 300 + [-total] * 7, np.float32))
    same(f"grouped float32 step {k}", grouped[0].numpy(), np.full([5], total, np.float32))
    same(f"grouped int32 step {k}", grouped[1].numpy(), np.full([2, 3], sum(k + r for r in range(N)), np.int32))
    same(f"grouped float64 step {k}", grouped[2].numpy(), np.full([4], total))
    if k == 1:
        held = [t.numpy().copy() for t in grouped], grouped  # the outputs of one call must not change later
    if k == 5:
        cache_size = len(ops._prepared)
assert len(ops._prepared) == cache_size, f"request cache grew from {cache_size} to {len(ops._prepared)} entries"
for copy, tensor in zip(*held):
    same("an earlier call's output", tensor.numpy(), copy)


# 2. One site, several shapes: each signature gets its own requests.
@tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
def dynamic(x):
    return hvd.allreduce(x, op=hvd.Sum, name="site.dynamic")


for length in (3, 5, 3, 1, 5):
    x = np.arange(length, dtype=np.float32) + R
    same(f"dynamic length {length}", dynamic(tf.constant(x)).numpy(), sum(np.arange(length) + r for r in range(N)))


# 3. Broadcast through a site, from the last rank.
@tf.function
def broadcast(k):
    return hvd.broadcast(tf.fill([3], tf.cast(k, tf.int64) * 10 + R), root_rank=N - 1, name="site.broadcast")


for k in range(3):
    same(f"broadcast {k}", broadcast(tf.constant(k, tf.int64)).numpy(), np.full([3], k * 10 + N - 1, np.int64))

# 4. A site another thread is running takes the general path, with the same results.
site = bridge.CallSite([bridge.Collective(bridge.OP_ALLREDUCE, "site.busy", ops.core_reduce_op(hvd.Sum))])
with site._busy:
    (out,) = site(np.full([4], R + 1.0, np.float32))
same("busy site", out, np.full([4], float(expected_sum), np.float32))
(out,) = site(np.full([4], R + 2.0, np.float32))
same("free site", out, np.full([4], float(expected_sum + N), np.float32))
results = {}


def in_thread():
    results["thread"] = site(np.full([4], 1.0, np.float32))[0]


thread = threading.Thread(target=in_thread)
thread.start()
thread.join()
same("site from another thread", results["thread"], np.full([4], float(N), np.float32))


# 5. One member whose shape differs between ranks: every rank gets an error naming it, then the site works again.
@tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
def mismatched(x):
    return hvd.grouped_allreduce([tf.ones([2]), x], op=hvd.Sum, name="site.mismatch")


try:
    mismatched(tf.ones([2 + R]))
    raise AssertionError("a shape mismatch between ranks went through")
except tf.errors.OpError as e:
    assert "Mismatched shapes for tensor 'site.mismatch.1': rank 0: [2]; rank 1: [3]" in str(e), str(e)
for r in range(2):
    got = mismatched(tf.ones([2]))
    same(f"after the error, call {r}", got[1].numpy(), np.full([2], float(N), np.float32))
