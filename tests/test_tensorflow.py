"""hvdlite.tensorflow across real processes: every collective eagerly and inside tf.function, their gradients,
errors, and DistributedGradientTape training against a single process on the global batch.

TensorFlow costs seconds to import per rank, so each test is ONE job that runs many checks; every job computes
its expected values itself and prints DONE.
"""

import pytest
from multiproc import run_checked, run_job

COMMON = """
import os, sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import hvdlite.tensorflow as hvd
hvd.init()
R, N = hvd.rank(), hvd.size()
MODES = ("eager", "graph")

def run(mode, fn):
    '''fn() eagerly, or traced into a tf.function and called; results as numpy (nested lists/tuples kept).'''
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
"""


def run(script, np=2, timeout=150):
    return run_checked(COMMON + script, np, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.timeout(240)
def test_collectives_eager_and_in_tf_function():
    run(
        """
def data(r, dtype, n=5):
    return (np.arange(n) + r).astype(dtype)

for mode in MODES:
    # allreduce: every dtype the core supports, Sum; Average / Min / Max / scaling on floats
    for dtype in ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"):
        tf_dtype = tf.as_dtype(dtype)
        got = run(mode, lambda: hvd.allreduce(tf.constant(data(R, "float64"), tf_dtype), op=hvd.Sum))
        expected = sum(data(r, "float64") for r in range(N))
        same(f"{mode} allreduce sum {dtype}", got.astype(np.float64), expected)
    x = tf.constant(data(R, "float32"))
    same(f"{mode} average", run(mode, lambda: hvd.allreduce(x)), np.mean([data(r, "float32") for r in range(N)], 0),
         1e-6)
    same(f"{mode} average deprecated arg", run(mode, lambda: hvd.allreduce(x, average=True)),
         np.mean([data(r, "float32") for r in range(N)], 0), 1e-6)
    same(f"{mode} min", run(mode, lambda: hvd.allreduce(x, op=hvd.Min)), data(0, "float32"))
    same(f"{mode} max", run(mode, lambda: hvd.allreduce(x, op=hvd.Max)), data(N - 1, "float32"))
    same(f"{mode} scaled", run(mode, lambda: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)),
         sum(data(r, "float32") for r in range(N)), 1e-5)
    fp16 = run(mode, lambda: hvd.allreduce(x * 1.001, compression=hvd.Compression.fp16))
    assert fp16.dtype == np.float32
    same(f"{mode} fp16 compression", fp16, np.mean([data(r, "float32") * 1.001 for r in range(N)], 0), 1e-2)
    same(f"{mode} scalar", run(mode, lambda: hvd.allreduce(tf.constant(float(R)), op=hvd.Sum)), float(sum(range(N))))
    g = run(mode, lambda: hvd.grouped_allreduce([x, tf.constant([R, 1], tf.int64), tf.ones([2, 3]) * R], op=hvd.Sum))
    same(f"{mode} grouped 0", g[0], sum(data(r, "float32") for r in range(N)))
    same(f"{mode} grouped 1", g[1], np.array([sum(range(N)), N]))
    same(f"{mode} grouped 2", g[2], np.full((2, 3), float(sum(range(N)))))
    # IndexedSlices: values and indices gathered, values averaged
    sl = run(mode, lambda: (lambda s: (s.values, s.indices))(hvd.allreduce(
        tf.IndexedSlices(tf.ones([1, 2]) * (R + 1), tf.constant([R]), tf.constant([N, 2])))))
    same(f"{mode} sparse values", sl[0], np.array([[r + 1.0] * 2 for r in range(N)]) / N, 1e-6)
    same(f"{mode} sparse indices", sl[1], np.arange(N))

    # allgather with ragged first dimension, scalars, bool, grouped
    rows = lambda r: np.full((r + 1, 2), r, np.int32)
    same(f"{mode} allgather ragged", run(mode, lambda: hvd.allgather(tf.constant(rows(R)))),
         np.concatenate([rows(r) for r in range(N)]))
    same(f"{mode} allgather scalar", run(mode, lambda: hvd.allgather(tf.constant(float(R)))),
         np.arange(N, dtype=np.float32))
    same(f"{mode} allgather bool", run(mode, lambda: hvd.allgather(tf.constant([R % 2 == 0]))),
         np.array([r % 2 == 0 for r in range(N)]))
    for dtype in ("int16", "uint16"):
        same(f"{mode} allgather {dtype}", run(mode, lambda: hvd.allgather(tf.constant(rows(R).astype(dtype)))),
             np.concatenate([rows(r) for r in range(N)]).astype(dtype))
    ga = run(mode, lambda: hvd.grouped_allgather([tf.constant(rows(R)), tf.constant([float(R)] * 3)]))
    same(f"{mode} grouped allgather", ga[1], np.repeat(np.arange(N, dtype=np.float32), 3))

    # broadcast from the last rank, several dtypes
    for dtype in ("float32", "int64", "bool", "bfloat16", "int16", "uint16"):
        value = tf.constant(data(R, "float32") > 2 if dtype == "bool" else data(R, "float32"), tf.as_dtype(dtype))
        expected = data(N - 1, "float32") > 2 if dtype == "bool" else data(N - 1, "float32")
        got = run(mode, lambda: hvd.broadcast(value, root_rank=N - 1)).astype(expected.dtype)
        same(f"{mode} broadcast {dtype}", got, expected)

    # alltoall with uneven splits: rank r sends (k + 1) rows tagged 100r + k to rank k
    splits = [k + 1 for k in range(N)]
    send = np.concatenate([np.full(k + 1, 100 * R + k, np.int64) for k in range(N)])
    out, received = run(mode, lambda: hvd.alltoall(tf.constant(send), splits=splits))
    same(f"{mode} alltoall", out, np.concatenate([np.full(R + 1, 100 * r + R, np.int64) for r in range(N)]))
    same(f"{mode} alltoall splits", received, np.full(N, R + 1, np.int32))
    out = run(mode, lambda: hvd.alltoall(tf.constant(np.arange(2 * N, dtype=np.float32) + 10 * R)))  # output only
    same(f"{mode} alltoall even", out,
         np.concatenate([[10 * r + 2 * R, 10 * r + 2 * R + 1] for r in range(N)]).astype(np.float32))
    out, _ = run(mode, lambda: hvd.alltoall(tf.constant(send), splits=tf.constant(splits)))
    same(f"{mode} alltoall tensor splits", out,
         np.concatenate([np.full(R + 1, 100 * r + R, np.int64) for r in range(N)]))

    # reducescatter: uneven rows go to the first ranks
    full = np.arange((N + 1) * 2, dtype=np.float32).reshape(N + 1, 2)
    got = run(mode, lambda: hvd.reducescatter(tf.constant(full * (R + 1)), op=hvd.Sum))
    counts = [(N + 1) // N + (1 if r < (N + 1) % N else 0) for r in range(N)]
    start = sum(counts[:R])
    same(f"{mode} reducescatter", got, full[start:start + counts[R]] * sum(r + 1 for r in range(N)))
    got = run(mode, lambda: hvd.grouped_reducescatter([tf.ones([N, 3]) * R, tf.ones([2 * N], tf.float64)],
                                                      op=hvd.Average))
    same(f"{mode} grouped reducescatter", got[0], np.full((1, 3), np.mean(range(N)), np.float32), 1e-6)
    same(f"{mode} grouped reducescatter 1", got[1], np.ones(2))

# broadcast_variables: one fused broadcast per dtype, eager and in a tf.function; bitcast for uint32
for mode in MODES:
    vs = [tf.Variable(np.full((2, 2), R, np.float32)), tf.Variable([R, R], dtype=tf.int64),
          tf.Variable(np.full(3, R, np.float32)), tf.Variable([R + 7], dtype=tf.uint32)]
    if mode == "eager":
        hvd.broadcast_variables(vs, root_rank=1)
    else:
        @tf.function
        def broadcast_in_graph():
            hvd.broadcast_variables(vs, root_rank=1)
        broadcast_in_graph()
    for v in vs:
        same(f"{mode} broadcast_variables {v.dtype.name}", v.numpy(),
             np.full(v.shape, 1 if v.dtype != tf.uint32 else 8))

# objects
obj = hvd.broadcast_object({"rank": R, "fn": (lambda v: v * 3)} if R == 0 else None, root_rank=0)
assert obj["rank"] == 0 and obj["fn"](2) == 6
assert hvd.broadcast_object_fn(root_rank=N - 1)(R) == N - 1
assert hvd.allgather_object({"r": R}) == [{"r": r} for r in range(N)]

# synchronisation and process sets
hvd.barrier()
tf.function(lambda: hvd.barrier())()
assert int(hvd.size_op()) == N and int(hvd.rank_op()) == R
edge = hvd.add_process_set([0, N - 1])
if R in (0, N - 1):
    for mode in MODES:
        same(f"{mode} process set",
             run(mode, lambda: hvd.allreduce(tf.constant([float(R)]), op=hvd.Sum, process_set=edge)), [float(N - 1)])
        same(f"{mode} process set bcast",
             run(mode, lambda: hvd.broadcast(tf.constant([R]), root_rank=N - 1, process_set=edge)), [N - 1])
hvd.barrier()
# join: a rank with no more data joins; the others' allreduce sees zeros from it
if R == 0:
    last = hvd.join()
else:
    same("allreduce with rank 0 joined", hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="after_join"), [N - 1.0])
    last = hvd.join()
assert int(last) in range(N)
print("DONE")
""",
        np=3,
    )


@pytest.mark.timeout(240)
def test_collective_gradients_errors_and_xla():
    run("""
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
    same(f"{mode} d allgather", grads(lambda a: tf.reduce_sum(hvd.allgather(a) * coef), a),
         coef[offset:offset + R + 1])  # Horovod averages the gradient over the set (torch.distributed.nn sums)
    b = tf.ones([3], tf.float64)
    same(f"{mode} d broadcast", grads(lambda b: tf.reduce_sum(hvd.broadcast(b, root_rank=1) * 2), b),
         np.full(3, 2.0 if R == 1 else 0.0))  # averaged onto the root
    t = tf.constant(np.arange(2 * N, dtype=np.float64))
    coef2 = np.arange(2 * N, dtype=np.float64) + 1
    # alltoall's gradient sends the output gradient back: rank r's rows 2k, 2k+1 went to rank k, position 2r, 2r+1
    expected = np.concatenate([[2 * R + 1, 2 * R + 2] for k in range(N)]).astype(np.float64)
    same(f"{mode} d alltoall", grads(lambda t: tf.reduce_sum(hvd.alltoall(t) * coef2), t), expected)
    s = tf.ones([2 * N, 3], tf.float64)
    same(f"{mode} d reducescatter sum", grads(lambda s: tf.reduce_sum(hvd.reducescatter(s, op=hvd.Sum) * 5), s),
         np.full((2 * N, 3), 5.0 * N))  # Horovod: times the set size for Sum
    same(f"{mode} d reducescatter avg", grads(lambda s: tf.reduce_sum(hvd.reducescatter(s) * 5), s),
         np.full((2 * N, 3), 5.0), 1e-12)

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
print("DONE")
""")


@pytest.mark.timeout(240)
def test_distributed_gradient_tape_matches_single_process():
    run("""
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
ids = np.array([[1, 2, 2], [3, 7, 1], [0, 9, 9], [4, 4, 5]])[:2 * N].reshape(N, -1)
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

# tf.compat.v1 optimizer: compute_gradients averages
v = tf.Variable([0.0, 0.0])
opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
opt.minimize(lambda: tf.reduce_sum(v * (R + 1.0)), var_list=[v])
same("v1 optimizer", v.numpy(), -np.full(2, np.mean([r + 1.0 for r in range(N)])), 1e-6)
print("DONE")
""")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("np", [2, 3])
def test_independent_collectives_in_one_graph_run(np):
    """Collectives with no data dependency between them, evaluated together: eagerly, in a tf.function, and in a
    tf.Graph run by a tf.compat.v1.Session with several inter-op threads, where TensorFlow may start them in any
    order on each rank (each waits for its peers while holding a thread)."""
    run(
        """
DTYPES = (tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.float32, tf.float64)
SHAPES = ((3,), (2, 3), (2, 1, 2))

def value(dtype, shape, r, rows=None):
    shape = shape if rows is None else (rows,) + shape[1:]
    return ((np.arange(int(np.prod(shape))) % 5) + r).reshape(shape).astype(dtype.as_numpy_dtype)

def build(kind, scale=None):
    '''21 independent collectives of one kind (7 dtypes x 3 shapes) and their expected results.'''
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
                expected.append(sum(value(dtype, shape, r, rows=2 * N) for r in range(N))[2 * R:2 * R + 2])
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
print("DONE")
""",
        np=np,
    )


@pytest.mark.timeout(240)
def test_graph_error_classes_indexed_slices_and_graph_gradients():
    """Eagerly, in a tf.function and in a tf.Graph run by a tf.compat.v1.Session: Horovod's error classes, its
    IndexedSlices reduction (integer Average, grouped with and without dense tensors, no pre/postscale), and the
    gradients of broadcast, grouped allgather and grouped reducescatter (inputs of unknown rank in graphs)."""
    run("""
def three_ways(fn, *args, specs=()):
    '''(mode, fn's results as numpy): eagerly, in a tf.function with input signature specs, and in a tf.Graph
    whose placeholders (of specs) a Session feeds with args.'''
    to_np = lambda out: [t.numpy() for t in out]
    yield "eager", to_np(fn(*[tf.constant(a) for a in args]))
    yield "tf.function", to_np(tf.function(fn, input_signature=list(specs))(*args))
    with tf.Graph().as_default():
        placeholders = [tf.compat.v1.placeholder(s.dtype, s.shape) for s in specs]
        out = fn(*placeholders)
        with tf.compat.v1.Session() as session:
            yield "session", session.run(out, dict(zip(placeholders, args)))

def one_mode(mode, fn):
    '''fn's results in one mode only (an error in a mode must not be raised by another).'''
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
    (lambda m: [hvd.allreduce(tf.ones([2 + R]), name=f"shape_{m}")], tf.errors.FailedPreconditionError,
     hvd.MismatchError, "Mismatched shapes"),
    (lambda m: [hvd.allreduce(tf.ones([2], tf.float32 if R == 0 else tf.float64), name=f"dtype_{m}")],
     tf.errors.FailedPreconditionError, hvd.MismatchError, "dtype_"),
    (lambda m: [hvd.broadcast(tf.ones([2]), root_rank=R, name=f"root_{m}")], tf.errors.FailedPreconditionError,
     hvd.MismatchError, "root_"),
    (lambda m: [hvd.broadcast(tf.ones([2]), root_rank=N + 5, name=f"no_root_{m}")], tf.errors.InvalidArgumentError,
     hvd.InvalidArgumentError, "root"),
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
    same(f"{mode} after errors", one_mode(mode, lambda: [hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)])[0],
         [float(N)])

# 2. IndexedSlices: values and indices gathered; Average divides the values with `/`, as Horovod does (integer
# values become floats); grouped alone and mixed with dense tensors; no pre/postscale and no other op.
def sparse():
    ints = tf.IndexedSlices(tf.fill([R + 1, 2], R + 1), tf.range(R + 1), tf.constant([N, 2]))
    floats = tf.IndexedSlices(tf.fill([1, 3], 2.0 * (R + 1)), tf.constant([N - 1 - R]), tf.constant([N, 3]))
    dense = tf.constant([float(R), 2.0])
    a = hvd.allreduce(ints, op=hvd.Average)
    g = hvd.grouped_allreduce([ints, floats])
    m = hvd.grouped_allreduce([floats, dense, ints], op=hvd.Sum)
    return [a.values, a.indices, g[0].values, g[0].indices, g[1].values, g[1].indices,
            m[0].values, m[0].indices, m[1], m[2].values, m[2].indices]
int_values = np.concatenate([np.full([r + 1, 2], r + 1, np.int32) for r in range(N)])
int_indices = np.concatenate([np.arange(r + 1, dtype=np.int32) for r in range(N)])
float_values = np.array([[2.0 * (r + 1)] * 3 for r in range(N)], np.float32)
float_indices = np.array([N - 1 - r for r in range(N)], np.int32)
expected = [int_values / N, int_indices, int_values / N, int_indices, float_values / N, float_indices,
            float_values, float_indices, np.array([sum(range(N)), 2.0 * N], np.float32), int_values, int_indices]
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
    refuses(wrap(lambda: hvd.grouped_allreduce([tf.ones([2]), slices], postscale_factor=0.5)[0]), NotImplementedError,
            "Pre/postscale")
    refuses(wrap(lambda: hvd.grouped_allreduce([slices], op=hvd.Max)[0].values), NotImplementedError,
            "Sum and Average")
same("after refusals", hvd.allreduce(tf.constant([2.0]), op=hvd.Sum), [2.0 * N])  # nothing was left half-issued

# 3. Gradients in graphs: broadcast (the root gets the average, the others zeros), grouped allgather and grouped
# reducescatter, with inputs whose rank is unknown to the graph.
def d_broadcast(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(hvd.broadcast(x, root_rank=N - 1) * 2.0)
    return [tape.gradient(loss, x)]
for mode, (g,) in three_ways(d_broadcast, np.full([1, 2], R + 1.0, np.float32),
                             specs=[tf.TensorSpec([1, 2], tf.float32)]):
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
for mode, (gx, gz) in three_ways(d_grouped_allgather, np.ones([R + 1, 2], np.float32), np.ones([3], np.float64),
                                 specs=unknown):
    same(f"{mode} d grouped allgather x", gx, coef[offset:offset + R + 1])
    same(f"{mode} d grouped allgather z", gz, np.full([3], 3.0))
def d_grouped_reducescatter(y, w):
    with tf.GradientTape() as tape:
        tape.watch([y, w])
        ry, rw = hvd.grouped_reducescatter([y, w], op=hvd.Sum)
        loss = tf.reduce_sum(ry * 5.0) + tf.cast(tf.reduce_sum(rw), tf.float32)
    return tape.gradient(loss, [y, w])
for mode, (gy, gw) in three_ways(d_grouped_reducescatter, np.ones([2 * N, 2], np.float32),
                                 np.ones([N, 3], np.float64), specs=unknown):
    same(f"{mode} d grouped reducescatter y", gy, np.full([2 * N, 2], 5.0 * N))  # Horovod: times N for Sum
    same(f"{mode} d grouped reducescatter w", gw, np.full([N, 3], 1.0 * N))
print("DONE")
""")


@pytest.mark.timeout(200)
def test_tf1_graph_mode_session_hook_and_v1_optimizer():
    result = run_job(
        """
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
import hvdlite.tensorflow as hvd
hvd.init()
R, N = hvd.rank(), hvd.size()
w = tf.compat.v1.get_variable("w", initializer=tf.constant([float(R), 1.0]))
x = tf.compat.v1.placeholder(tf.float32, [])  # fed to train only: the hook's broadcast must run without it
train = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5)).minimize(tf.reduce_sum(w * x))
total = hvd.allreduce(tf.constant([float(R)]), op=hvd.Sum)
# Independent collectives evaluated together; TensorFlow may start them in any order on each rank.
together = []
for i, dtype in enumerate((tf.int32, tf.float16, tf.float64) * 7):
    together.append(hvd.allreduce(tf.constant([R + i], dtype), op=hvd.Sum) if i % 3 else
                    hvd.allgather(tf.fill([R + 1], tf.cast(i, dtype))))
from_rank_1 = hvd.broadcast_global_variables(1)
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)], config=config) as sess:
    assert np.array_equal(sess.run(w), [0.0, 1.0])  # rank 0's initial value everywhere
    sess.run(train, feed_dict={x: R + 1.0})
    mean_grad = np.mean([r + 1.0 for r in range(N)])
    assert np.allclose(sess.run(w), [0.0 - 0.5 * mean_grad, 1.0 - 0.5 * mean_grad]), sess.run(w)
    assert sess.run(total)[0] == sum(range(N))
    for i, got in enumerate(sess.run(together)):
        expected = [sum(r + i for r in range(N))] if i % 3 else [i] * sum(r + 1 for r in range(N))
        assert np.array_equal(got, expected), (i, got, expected)
    sess.run(from_rank_1)
print("DONE")
""",
        np=2,
        timeout=150,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert out.count("DONE") == 2, out


def test_tf_function_error_classes_single_process():
    """The status hook maps only our own failures: a user's exception in a numpy_function stays UnknownError."""
    run_checked(
        """
import tensorflow as tf
import hvdlite.tensorflow as hvd
from hvdlite.tensorflow import errors
hvd.init()

def fail_with(exc):
    def body(x):
        raise exc

    @tf.function
    def call():
        return tf.numpy_function(body, [tf.ones([1])], tf.float32, stateful=True)
    return call

cases = [(hvd.MismatchError, tf.errors.FailedPreconditionError), (hvd.PeerError, tf.errors.UnavailableError),
         (hvd.HvdliteTimeoutError, tf.errors.DeadlineExceededError), (hvd.HvdliteError, tf.errors.UnknownError)]
for hvd_class, tf_class in cases:
    try:
        fail_with(errors.TF_ERRORS[hvd_class]("peer 1 went away"))()
    except tf_class as e:
        assert isinstance(e, hvd_class) and "peer 1 went away" in str(e), (type(e).__mro__, str(e))
        assert "Detected at node" in str(e), "TensorFlow's context must be kept"
    else:
        raise SystemExit(f"{hvd_class} not raised")
try:  # not ours, even with a message that mentions our classes
    fail_with(RuntimeError("MismatchError: hvdlite.tensorflow.errors.PeerError: x"))()
except tf.errors.UnknownError as e:
    assert not isinstance(e, hvd.HvdliteError), type(e).__mro__
assert errors.install_status_hook()  # idempotent
print("DONE")
""",
        1,
        timeout=120,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
