"""hvdlite.tensorflow behaves as horovod.tensorflow where Horovod's own tests pin it down: default ops, deprecated
arguments, gradient grouping and the errors and warnings Horovod raises."""

import keras
import numpy as np
import tensorflow as tf
from horovod_tf_common import N, R, Recorder, close, hvd, raises, warns

mean_r1 = np.mean([r + 1.0 for r in range(N)])
x = tf.constant([1.0, 2.0]) * (R + 1)

# allreduce: the default op is Average, eagerly and in a tf.function; `average` is deprecated but honoured
close("default average", hvd.allreduce(x), [mean_r1, 2 * mean_r1])
close("default average in graph", tf.function(lambda: hvd.allreduce(x))(), [mean_r1, 2 * mean_r1])
close(
    "average=False",
    warns(DeprecationWarning, lambda: hvd.allreduce(x, average=False)),
    [N * mean_r1, 2 * N * mean_r1],
)
raises(ValueError, lambda: hvd.allreduce(x, average=True, op=hvd.Sum), "supersedes average")
close("grouped default average", hvd.grouped_allreduce([x])[0], [mean_r1, 2 * mean_r1])
close("reducescatter default average", hvd.reducescatter(tf.ones([N, 2]) * R), [[np.mean(range(N))] * 2])


# name=None: unnamed collectives inside a tf.function are named by their place in the function, not by
# process-local tensor names; a named one under rank-dependent name scopes agrees with ignore_name_scope=True
@tf.function
def scoped(v):
    with tf.name_scope(f"scope_of_rank_{R}"):
        shared = hvd.allreduce(v, name="shared", ignore_name_scope=True, op=hvd.Sum)
        unnamed = hvd.allreduce(v * 2.0, op=hvd.Sum)
        gathered = hvd.allgather(v[:1])
    return shared, unnamed, gathered


for _ in range(2):
    shared, unnamed, gathered = scoped(x)
    close("ignore_name_scope", shared, [N * mean_r1, 2 * N * mean_r1])
    close("unnamed in graph", unnamed, [2 * N * mean_r1, 4 * N * mean_r1])
    close("unnamed allgather", gathered, [r + 1.0 for r in range(N)])
close("unnamed eager", hvd.allreduce(x, op=hvd.Sum), [N * mean_r1, 2 * N * mean_r1])

# alltoall: just the output without splits, (output, received_splits) with them (Horovod's return values)
single = hvd.alltoall(tf.range(N, dtype=tf.int32) + 10 * R)
assert isinstance(single, tf.Tensor), type(single)
close("alltoall", single, [10 * r + R for r in range(N)])
out, received = hvd.alltoall(tf.range(N, dtype=tf.int32) + 10 * R, splits=[1] * N)
close("alltoall splits", received, [1] * N)
single = tf.function(lambda: hvd.alltoall(tf.range(N, dtype=tf.int32)))()
assert isinstance(single, tf.Tensor), type(single)

# process_set keyword on every collective and helper; Horovod's positional order of grouped_reducescatter
edge = hvd.add_process_set([0, N - 1])
if R in (0, N - 1):
    me = edge.rank()
    close("ps allreduce", hvd.allreduce(tf.constant([float(R)]), process_set=edge), [(N - 1) / 2.0])
    close("ps allgather", hvd.allgather(tf.constant([R]), process_set=edge), [0, N - 1])
    close("ps broadcast", hvd.broadcast(tf.constant([R]), N - 1, process_set=edge), [N - 1])
    close("ps reducescatter", hvd.reducescatter(tf.ones([2, 1]) * R, op=hvd.Sum, process_set=edge), [[N - 1.0]])
    got = hvd.grouped_reducescatter([tf.ones([2, 1]) * R], "", hvd.Compression.none, hvd.Sum, edge, 2.0, 0.5)
    close("ps grouped reducescatter (positional)", got[0], [[N - 1.0]])
    assert hvd.broadcast_object({"r": R} if R == N - 1 else None, root_rank=N - 1, process_set=edge) == {"r": N - 1}
    assert hvd.allgather_object(R, process_set=edge) == [0, N - 1]
    w = tf.Variable([float(R)])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * (R + 1.0))
    (g,) = hvd.DistributedGradientTape(tape, process_set=edge).gradient(loss, [w])
    close("ps tape", g, [(1.0 + N) / 2.0])
hvd.barrier()

# broadcast_object returns the object on every rank (the root gets its own object back); broadcast_ returns
# the variables' new values
mine = {"from": R, "f": (lambda v: v + 1)}
got = hvd.broadcast_object(mine if R == 1 else None, root_rank=1)
assert got["from"] == 1 and got["f"](1) == 2 and (got is mine) == (R == 1)
assert hvd.broadcast_object_fn(root_rank=0)("r%d" % R) == "r0"
vs = [tf.Variable([float(R)] * 2), tf.Variable(R, dtype=tf.int64)]
values = hvd.broadcast_(vs, root_rank=N - 1)
close("broadcast_ values", values[0], [N - 1.0] * 2)
close("broadcast_ int", values[1], N - 1)
close("broadcast_ assigned", vs[0], [N - 1.0] * 2)
# ... also of TF1 reference variables in a graph run by a Session (their dtypes are bool_ref, int8_ref, ...)
with tf.Graph().as_default():
    refs = [
        tf.compat.v1.Variable(tf.cast(tf.fill([3], R % 2), dt), use_resource=False)
        for dt in (tf.bool, tf.int8, tf.float16)
    ]
    new_values = hvd.broadcast_(refs, root_rank=1)
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for value in session.run(new_values):
            close("broadcast_ of reference variables", value.astype(np.float64), [1.0] * 3)

# DistributedGradientTape: op, gradient_predivide_factor, groups, use_generic_names, unconnected_gradients
a, b, c = tf.Variable([1.0, 2.0]), tf.Variable([1.0, 1.0, 1.0]), tf.Variable([3.0])


def tape_grads(**kwargs):
    with tf.GradientTape() as tape:
        loss = (R + 1.0) * (tf.reduce_sum(a) + tf.reduce_sum(b) + tf.reduce_sum(c))
    return hvd.DistributedGradientTape(tape, **kwargs).gradient(loss, [a, b, c])


for kwargs, factor in (
    ({}, mean_r1),
    ({"op": hvd.Sum}, N * mean_r1),
    ({"op": hvd.Max}, float(N)),
    ({"op": hvd.Min}, 1.0),
    ({"gradient_predivide_factor": 4.0}, mean_r1),
):
    for g, v in zip(tape_grads(**kwargs), (a, b, c)):
        close(f"tape {kwargs}", g, np.full(v.shape, factor))
raises(
    ValueError,
    lambda: tape_grads(op=hvd.Sum, gradient_predivide_factor=2.0),
    "gradient_predivide_factor not supported with op != Average",
)
# Adasum reduces the gradients as Horovod's tape does, and like Horovod needs a power-of-two number of ranks (3 here)
raises(tf.errors.InvalidArgumentError, lambda: tape_grads(op=hvd.Adasum), "Adasum", "power-of-two")
raises(ValueError, lambda: tape_grads(groups=0), "groups should be")
# groups=n: the gradients split in order into n runs (Horovod's split_list: [a, b] and [c]); a list of
# variable lists: one buffer per list and one per variable in none; num_groups is the deprecated alias
T = "DistributedGradientTape"
for kwargs, expected in (
    ({"groups": 2}, [(f"{T}.0.float32", (5,)), (f"{T}.1.float32", (1,))]),
    ({"num_groups": 2}, [(f"{T}.0.float32", (5,)), (f"{T}.1.float32", (1,))]),
    ({"groups": [[a, c]]}, [(f"{T}.g0.float32", (3,)), (f"{T}.v1.float32", (3,))]),
    ({}, [(f"{T}.0.float32", (6,))]),
):
    with Recorder() as rec:
        grads = (
            warns(DeprecationWarning, lambda: tape_grads(**kwargs))
            if "num_groups" in kwargs
            else tape_grads(**kwargs)
        )
    assert rec.calls == [expected], (kwargs, rec.calls)
    for g, v in zip(grads, (a, b, c)):
        close(f"grouped {kwargs}", g, np.full(v.shape, mean_r1))
with tf.GradientTape() as tape:
    loss = (R + 1.0) * tf.reduce_sum(a)
ga, gb = hvd.DistributedGradientTape(tape).gradient(loss, [a, b], None, tf.UnconnectedGradients.ZERO)
close("positional unconnected_gradients", gb, [0.0, 0.0, 0.0])
with tf.GradientTape() as tape:
    loss = (R + 1.0) * tf.reduce_sum(a)
(ga,) = hvd.DistributedGradientTape(tape).gradient(loss, [a], use_generic_names=True)
close("use_generic_names", ga, [mean_r1, mean_r1])
# IndexedSlices support Average and Sum only (Horovod's NotImplementedError), densified they take any op
table = tf.Variable(np.ones((4, 2), np.float32))


def sparse_grad(**kwargs):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [R % 4])) * (R + 1.0)
    return hvd.DistributedGradientTape(tape, **kwargs).gradient(loss, [table])[0]


raises(NotImplementedError, lambda: sparse_grad(op=hvd.Min), "Only Sum and Average")
dense_min = sparse_grad(op=hvd.Min, sparse_as_dense=True)
close("sparse as dense min", dense_min, np.zeros((4, 2)) if N < 4 else np.ones((4, 2)))

# tf.compat.v1 DistributedOptimizer, eagerly and in a tf.function (Horovod: TF1 graphs only, see the next test):
# backward_passes_per_step, average_aggregated_gradients, global_step; momentum sees only the applied steps
for average in (False, True):
    for graph in (False, True):
        v = tf.Variable([0.0, 0.0])
        step = tf.Variable(0, dtype=tf.int64)
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.MomentumOptimizer(1.0, 0.5),
            backward_passes_per_step=2,
            average_aggregated_gradients=average,
        )

        def train(p):
            return opt.minimize(lambda: tf.reduce_sum(v * (R + 1.0) * p), var_list=[v], global_step=step)

        train = tf.function(train) if graph else train
        seen = []
        for p in range(4):
            train(tf.constant(p + 1.0))
            seen.append(v.numpy()[0])
        first, second = [s * mean_r1 / (2.0 if average else 1.0) for s in (1 + 2, 3 + 4)]
        expected = [0.0, -first, -first, -first - (0.5 * first + second)]
        close(f"v1 passes average={average} graph={graph}", seen, expected, atol=1e-5)
        assert int(step.numpy()) == 4, int(step.numpy())  # every pass advances global_step, as in Horovod
raises(
    ValueError,
    lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1.0), op=hvd.Sum, gradient_predivide_factor=2.0
    ),
    "op != Average",
)
raises(
    ValueError,
    lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1.0), op=hvd.Adasum, average_aggregated_gradients=True
    ),
    "Adasum",
)
raises(
    NotImplementedError,
    lambda: hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), op=hvd.Adasum),
    "Adasum",
    "DistributedGradientTape",
)
raises(
    ValueError,
    lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum),
    "not supported yet with Keras",
)
# op=Max through the v1 optimizer: the elementwise maximum of every rank's gradient
v = tf.Variable([0.0])
opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), op=hvd.Max)
opt.minimize(lambda: tf.reduce_sum(v * (R + 1.0)), var_list=[v])
close("v1 max", v, [-float(N)])

# Compression: Horovod's compressor interface, compress(tensor, ctx=None)
wire, ctx = hvd.Compression.fp16.compress(tf.constant([1.5], tf.float64), None)
assert wire.dtype == tf.float16 and hvd.Compression.fp16.decompress(wire, ctx).dtype == tf.float64
assert hvd.SyncBatchNormalization(fused=False) is not None
assert hvd.SyncBatchNormalization(fused=None) is not None  # Keras 3 has no fused kernel for None to choose
raises(ValueError, lambda: hvd.SyncBatchNormalization(fused=True), "fused=True")
