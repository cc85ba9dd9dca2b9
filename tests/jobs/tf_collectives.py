"""Every collective of hvdlite.tensorflow eagerly and inside a tf.function: every dtype, ops and scaling,
compression, grouped forms, IndexedSlices, ragged allgather, broadcast, alltoall, reducescatter, join."""

import numpy as np
import tensorflow as tf
from tf_common import MODES, N, R, hvd, run, same


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
    same(
        f"{mode} average",
        run(mode, lambda: hvd.allreduce(x)),
        np.mean([data(r, "float32") for r in range(N)], 0),
        1e-6,
    )
    same(
        f"{mode} average deprecated arg",
        run(mode, lambda: hvd.allreduce(x, average=True)),
        np.mean([data(r, "float32") for r in range(N)], 0),
        1e-6,
    )
    same(f"{mode} min", run(mode, lambda: hvd.allreduce(x, op=hvd.Min)), data(0, "float32"))
    same(f"{mode} max", run(mode, lambda: hvd.allreduce(x, op=hvd.Max)), data(N - 1, "float32"))
    same(
        f"{mode} scaled",
        run(mode, lambda: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)),
        sum(data(r, "float32") for r in range(N)),
        1e-5,
    )
    fp16 = run(mode, lambda: hvd.allreduce(x * 1.001, compression=hvd.Compression.fp16))
    assert fp16.dtype == np.float32
    same(f"{mode} fp16 compression", fp16, np.mean([data(r, "float32") * 1.001 for r in range(N)], 0), 1e-2)
    same(f"{mode} scalar", run(mode, lambda: hvd.allreduce(tf.constant(float(R)), op=hvd.Sum)), float(sum(range(N))))
    g = run(mode, lambda: hvd.grouped_allreduce([x, tf.constant([R, 1], tf.int64), tf.ones([2, 3]) * R], op=hvd.Sum))
    same(f"{mode} grouped 0", g[0], sum(data(r, "float32") for r in range(N)))
    same(f"{mode} grouped 1", g[1], np.array([sum(range(N)), N]))
    same(f"{mode} grouped 2", g[2], np.full((2, 3), float(sum(range(N)))))
    # IndexedSlices: values and indices gathered, values averaged
    sl = run(
        mode,
        lambda: (lambda s: (s.values, s.indices))(
            hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]) * (R + 1), tf.constant([R]), tf.constant([N, 2])))
        ),
    )
    same(f"{mode} sparse values", sl[0], np.array([[r + 1.0] * 2 for r in range(N)]) / N, 1e-6)
    same(f"{mode} sparse indices", sl[1], np.arange(N))

    # allgather with ragged first dimension, scalars, bool, grouped
    rows = lambda r: np.full((r + 1, 2), r, np.int32)
    same(
        f"{mode} allgather ragged",
        run(mode, lambda: hvd.allgather(tf.constant(rows(R)))),
        np.concatenate([rows(r) for r in range(N)]),
    )
    same(
        f"{mode} allgather scalar",
        run(mode, lambda: hvd.allgather(tf.constant(float(R)))),
        np.arange(N, dtype=np.float32),
    )
    same(
        f"{mode} allgather bool",
        run(mode, lambda: hvd.allgather(tf.constant([R % 2 == 0]))),
        np.array([r % 2 == 0 for r in range(N)]),
    )
    for dtype in ("int16", "uint16"):
        same(
            f"{mode} allgather {dtype}",
            run(mode, lambda: hvd.allgather(tf.constant(rows(R).astype(dtype)))),
            np.concatenate([rows(r) for r in range(N)]).astype(dtype),
        )
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
    same(
        f"{mode} alltoall even",
        out,
        np.concatenate([[10 * r + 2 * R, 10 * r + 2 * R + 1] for r in range(N)]).astype(np.float32),
    )
    out, _ = run(mode, lambda: hvd.alltoall(tf.constant(send), splits=tf.constant(splits)))
    same(
        f"{mode} alltoall tensor splits",
        out,
        np.concatenate([np.full(R + 1, 100 * r + R, np.int64) for r in range(N)]),
    )

    # reducescatter: uneven rows go to the first ranks
    full = np.arange((N + 1) * 2, dtype=np.float32).reshape(N + 1, 2)
    got = run(mode, lambda: hvd.reducescatter(tf.constant(full * (R + 1)), op=hvd.Sum))
    counts = [(N + 1) // N + (1 if r < (N + 1) % N else 0) for r in range(N)]
    start = sum(counts[:R])
    same(f"{mode} reducescatter", got, full[start : start + counts[R]] * sum(r + 1 for r in range(N)))
    got = run(
        mode, lambda: hvd.grouped_reducescatter([tf.ones([N, 3]) * R, tf.ones([2 * N], tf.float64)], op=hvd.Average)
    )
    same(f"{mode} grouped reducescatter", got[0], np.full((1, 3), np.mean(range(N)), np.float32), 1e-6)
    same(f"{mode} grouped reducescatter 1", got[1], np.ones(2))

# broadcast_variables: one fused broadcast per dtype, eager and in a tf.function; bitcast for uint32
for mode in MODES:
    vs = [
        tf.Variable(np.full((2, 2), R, np.float32)),
        tf.Variable([R, R], dtype=tf.int64),
        tf.Variable(np.full(3, R, np.float32)),
        tf.Variable([R + 7], dtype=tf.uint32),
    ]
    if mode == "eager":
        hvd.broadcast_variables(vs, root_rank=1)
    else:

        @tf.function
        def broadcast_in_graph():
            hvd.broadcast_variables(vs, root_rank=1)

        broadcast_in_graph()
    for v in vs:
        same(
            f"{mode} broadcast_variables {v.dtype.name}",
            v.numpy(),
            np.full(v.shape, 1 if v.dtype != tf.uint32 else 8),
        )

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
        same(
            f"{mode} process set",
            run(mode, lambda: hvd.allreduce(tf.constant([float(R)]), op=hvd.Sum, process_set=edge)),
            [float(N - 1)],
        )
        same(
            f"{mode} process set bcast",
            run(mode, lambda: hvd.broadcast(tf.constant([R]), root_rank=N - 1, process_set=edge)),
            [N - 1],
        )
hvd.barrier()
# join: a rank with no more data joins; the others' allreduce sees zeros from it
if R == 0:
    last = hvd.join()
else:
    same("allreduce with rank 0 joined", hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="after_join"), [N - 1.0])
    last = hvd.join()
assert int(last) in range(N)
