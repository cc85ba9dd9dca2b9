"""DistributedGradientTape trains as one process on the global batch does, eagerly and in a tf.function, with
sparse gradients too."""

import numpy as np
import tensorflow as tf
from tf_common import N, R, hvd, same

B, STEPS, LR, MOMENTUM = 4, 5, 0.1, 0.9
rng = np.random.default_rng(0)
init = [rng.normal(size=s).astype(np.float32) * 0.5 for s in ((6, 16), (16,), (16, 3), (3,))]
X = rng.normal(size=(STEPS, N * B, 6)).astype(np.float32)
Y = rng.integers(0, 3, size=(STEPS, N * B))


def make():
    return [tf.Variable(v) for v in init]


def loss_fn(params, x, y):
    w1, b1, w2, b2 = params
    logits = tf.tanh(x @ w1 + b1) @ w2 + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def train(params, distributed, graph, rows, **tape_kwargs):
    velocity = [tf.Variable(tf.zeros_like(p)) for p in params]

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(params, x, y)
        if distributed:
            tape = hvd.DistributedGradientTape(tape, **tape_kwargs)
        grads = tape.gradient(loss, params)
        for p, v, g in zip(params, velocity, grads):
            v.assign(MOMENTUM * v - LR * g)
            p.assign_add(v)

    step = tf.function(step) if graph else step
    for s in range(STEPS):
        step(tf.constant(X[s][rows]), tf.constant(Y[s][rows]))
    return np.concatenate([p.numpy().ravel() for p in params])


mine = slice(R * B, (R + 1) * B)
reference = train(make(), False, True, slice(None))
for graph in (True, False):
    for kwargs in ({}, {"num_groups": 2}, {"op": hvd.Sum}, {"gradient_predivide_factor": 2.0}):
        got = train(make(), True, graph, mine, **kwargs)
        everyone = hvd.allgather_object(got, name=f"tape{graph}{sorted(kwargs)}")
        assert all(np.array_equal(e, got) for e in everyone), f"{kwargs}: ranks differ"
        if kwargs.get("op") == hvd.Sum:
            assert np.abs(got - reference).max() > 1e-3  # summed gradients: N times larger steps
        else:
            assert np.allclose(got, reference, atol=1e-5), (kwargs, np.abs(got - reference).max())
got = train(make(), True, True, mine, compression=hvd.Compression.fp16)
assert 0 < np.abs(got - reference).max() < 1e-2, np.abs(got - reference).max()

# Sparse gradients (tf.gather -> IndexedSlices): allgathered, or densified with sparse_as_dense
table0 = rng.normal(size=(10, 3)).astype(np.float32)
ids = np.array([[1, 2, 2], [3, 7, 1], [0, 9, 9], [4, 4, 5]])[: 2 * N].reshape(N, -1)


def embedding_step(rows, graph, **kwargs):
    table = tf.Variable(table0)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, tf.constant(rows)) ** 2)
        tape = hvd.DistributedGradientTape(tape, **kwargs)
        (g,) = tape.gradient(loss, [table])
        assert isinstance(g, tf.IndexedSlices) != kwargs.get("sparse_as_dense", False), type(g)
        table.assign_sub(0.5 * tf.convert_to_tensor(g))

    (tf.function(step) if graph else step)()
    return table.numpy()


ref = tf.Variable(table0)
with tf.GradientTape() as tape:
    loss = sum(tf.reduce_sum(tf.gather(ref, tf.constant(ids[r])) ** 2) for r in range(N)) / N
ref.assign_sub(0.5 * tf.convert_to_tensor(tape.gradient(loss, ref)))
for graph in (False, True):
    for as_dense in (False, True):
        got = embedding_step(ids[R], graph, sparse_as_dense=as_dense)
        assert np.allclose(got, ref.numpy(), atol=1e-6), (graph, as_dense, np.abs(got - ref.numpy()).max())

# Local sources keep their own gradient, scaled by 1/size; None gradients stay None
shared, local, unused = tf.Variable([1.0]), tf.Variable([1.0]), tf.Variable([1.0])
with tf.GradientTape() as tape:
    loss = shared * (R + 1) + local * (R + 1)
tape = hvd.PartialDistributedGradientTape(tape)
tape.register_local_source(local)
gs, gl, gu = tape.gradient(loss, [shared, local, unused])
same("shared grad", gs, [np.mean([r + 1.0 for r in range(N)])])
same("local grad", gl, [(R + 1.0) / N])
assert gu is None

# Ranks disagreeing on which variables have gradients: a clear error naming the fused buffer, not a hang
a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(a) + (tf.reduce_sum(b) if R == 0 else 0.0)
try:
    hvd.DistributedGradientTape(tape).gradient(loss, [a, b])
except tf.errors.FailedPreconditionError as e:
    assert "DistributedGradientTape.0.float32" in str(e) and "unconnected_gradients" in str(e), str(e)
else:
    raise SystemExit("mismatched gradients accepted")
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(a) + (tf.reduce_sum(b) if R == 0 else 0.0)
ga, gb = hvd.DistributedGradientTape(tape).gradient(loss, [a, b], unconnected_gradients=tf.UnconnectedGradients.ZERO)
same("zero-filled unconnected", gb, [1.0 / N], 1e-7)

# Models that differ between ranks in a way the fused buffer's size does not show ([2, 3] against [3, 2]): the
# buffer carries a digest of its layout, so every rank fails instead of averaging unrelated elements, eagerly and
# in a graph.
w, c = tf.Variable(tf.ones([2, 3] if R == 0 else [3, 2])), tf.Variable([1.0])
for graph in (False, True):

    def gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w) + tf.reduce_sum(c)
        return hvd.DistributedGradientTape(tape).gradient(loss, [w, c])

    try:
        (tf.function(gradient) if graph else gradient)()
    except tf.errors.FailedPreconditionError as e:
        assert "layouts of the packed tensors" in str(e) and "same shapes" in str(e), str(e)
    else:
        raise SystemExit(f"gradients of differently shaped variables accepted (graph={graph})")

# tf.compat.v1 optimizer: compute_gradients averages
v = tf.Variable([0.0, 0.0])
opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
opt.minimize(lambda: tf.reduce_sum(v * (R + 1.0)), var_list=[v])
same("v1 optimizer", v.numpy(), -np.full(2, np.mean([r + 1.0 for r in range(N)])), 1e-6)
