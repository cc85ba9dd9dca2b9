# Job script: every collective x dtype x size, checked on every rank against a local reference.
# argv[1]: "full" or "small" (a reduced sweep for the slower transports).
# Prepended by the test: sys.path setup so that `import hvdjob` works.
import itertools
import os
import sys
import time

import torch
from hvdjob import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    SHAPES,
    check,
    check_backend,
    even_rows,
    expected_caller_spin,
    launched_size,
    make,
    parse_build_info,
    reduce_reference,
    value_range,
)

import hvdlite.torch as hvd
from hvdlite.common import binding

LEVEL = sys.argv[1] if len(sys.argv) > 1 else "full"
FULL = LEVEL == "full"

hvd.init()
n, me = hvd.size(), hvd.rank()
assert hvd.is_initialized()
assert 0 <= me < n and n == launched_size(), (me, n)
check_backend(hvd)
assert hvd.local_size() * hvd.cross_size() == n or not hvd.is_homogeneous()

info = parse_build_info(hvd.build_info())
# A waiting caller spins long only where every rank on its machine has a CPU: all of a sweep's ranks run on this
# one, emulated hosts included (2 to 6 ranks on CI's 2 CPUs).
spin = int(info["caller_spin_us"])
assert spin == expected_caller_spin(hvd.size()), (spin, hvd.size())
expect_transport = os.environ.get("EXPECT_TRANSPORT")
if expect_transport:
    # Prove the job really runs on the transport the test is about.
    if expect_transport == "tcp":
        assert int(info["tcp_peers"]) > 0, info
    elif expect_transport == "shm-nocma":
        assert int(info["shm_peers"]) == n - 1 and info["cma"] == "0", info
    elif expect_transport == "shm":
        assert int(info["shm_peers"]) == n - 1 and int(info["tcp_peers"]) == 0, info
    else:
        raise AssertionError(f"unknown EXPECT_TRANSPORT {expect_transport}")

# A source build binds the core through cffi's compiled module; the sweep that names another core file takes the
# ABI-mode fallback the manylinux wheel uses.
assert binding.mode == os.environ.get("EXPECT_BINDING", "compiled"), binding.mode
# The per-tensor calls in C are linked to the package's core: only the compiled binding, bound to it too, uses them.
assert (binding.fast_calls is not None) == (binding.mode == "compiled"), binding.fast_calls

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
DTYPES = ALL_DTYPES
SIZES = list(SHAPES) if FULL else ["zero", "one", "odd", "large"]
OP_NAMES = list(OPS) if FULL else ["Sum", "Average", "Max"]
# Large tensors cost most (every rank builds every rank's input and the reference): in the reduced sweep they
# run for one dtype of each element size (plus bool); the full sweep runs all of them.
LARGE_DTYPES = DTYPES if FULL else [torch.uint8, torch.bool, torch.float16, torch.int32, torch.float64]
count = 0


def ok():
    global count
    count += 1


def inputs_for(key, shape, dtype, lo=-4, hi=4):
    return [make(r, key, shape, dtype, lo, hi) for r in range(n)]


# ----------------------------------------------------------------------------------------------- allreduce
variant_cycle = itertools.cycle(["plain", "named", "inplace", "async", "async_inplace", "noncontig_inplace"])
for dtype, size, opname in itertools.product(DTYPES, SIZES, OP_NAMES):
    if dtype == torch.bool and opname == "Average":
        continue  # rejected: tested in test_errors
    if size == "large" and dtype not in LARGE_DTYPES:
        continue
    shape = SHAPES[size]
    key = ("allreduce", dtype, size, opname)
    lo, hi = value_range(opname, dtype)
    inputs = inputs_for(key, shape, dtype, lo, hi)
    expected = reduce_reference(inputs, opname, dtype)
    exact = opname != "Average" or dtype not in FLOAT_DTYPES
    variant = next(variant_cycle)
    what = f"allreduce[{variant}] {dtype} {size} {opname} (rank {me} of {n})"
    mine = inputs[me].clone()
    if variant in ("plain", "named"):
        name = f"ar.{dtype}.{size}.{opname}" if variant == "named" else None
        out = hvd.allreduce(mine, name=name, op=OPS[opname])
        check(what + " input untouched", mine, inputs[me])
    elif variant == "inplace":
        out = hvd.allreduce_(mine, op=OPS[opname], name=f"ari.{dtype}.{size}.{opname}")
        if out is not mine:
            raise AssertionError(what + ": allreduce_ did not return its argument")
    elif variant == "async":
        h = hvd.allreduce_async(mine, op=OPS[opname], name=f"ara.{dtype}.{size}.{opname}")
        while not hvd.poll(h):
            time.sleep(0.0002)
        out = hvd.synchronize(h)
        check(what + " input untouched", mine, inputs[me])
    elif variant == "async_inplace":
        h = hvd.allreduce_async_(mine, op=OPS[opname])
        out = hvd.synchronize(h)
        check(what + " result is the argument", mine, expected, exact)
    else:  # a non-contiguous tensor reduced in place (transposed view)
        base = mine.reshape(-1, 1).expand(-1, 2).contiguous().t()  # (2, N), non-contiguous
        if base.numel() > 2:
            assert not base.is_contiguous()
        out = hvd.allreduce_(base, op=OPS[opname])
        check(what + " noncontig row 0", out[0], expected.reshape(-1), exact)
        check(what + " noncontig row 1", out[1], expected.reshape(-1), exact)
        ok()
        continue
    check(what, out, expected, exact)
    ok()

# Average with the deprecated average= argument, and Sum default check: default op is Average.
for dtype in (torch.float32, torch.int32):
    inputs = inputs_for(("avgdefault", dtype), (33,), dtype)
    check(
        f"allreduce default op {dtype}",
        hvd.allreduce(inputs[me]),
        reduce_reference(inputs, "Average", dtype),
        exact=dtype != torch.float32,
    )
    check(
        f"allreduce average=False {dtype}",
        hvd.allreduce(inputs[me], average=False),
        reduce_reference(inputs, "Sum", dtype),
    )
    ok()

# ----------------------------------------------------------------------------------------------- pre/postscale
SCALES = [(0.5, 3.0), (2.0, 1.0), (1.0, 0.25)] if FULL else [(0.5, 3.0)]
SCALED_SIZES = ["odd", "large"] if FULL else ["large"]
for dtype, size, opname, (pre, post) in itertools.product(
    [d for d in DTYPES if d != torch.bool], SCALED_SIZES, ["Sum", "Average", "Min", "Max"], SCALES
):
    if size == "large" and (
        (pre, post) != SCALES[0] or opname not in ("Sum", "Average") or dtype not in LARGE_DTYPES
    ):
        continue  # large: one scale pair through the ring / single-copy path is enough
    shape = SHAPES[size]
    key = ("scaled", dtype, size, opname, pre, post)
    inputs = inputs_for(key, shape, dtype, *value_range(opname, dtype))
    expected = reduce_reference(inputs, opname, dtype, pre, post)
    exact = opname != "Average" or dtype not in FLOAT_DTYPES  # small integers and halves: exact
    what = f"allreduce scaled pre={pre} post={post} {dtype} {size} {opname}"
    out = hvd.allreduce(
        inputs[me],
        op=OPS[opname],
        prescale_factor=pre,
        postscale_factor=post,
        name=f"sc.{dtype}.{size}.{opname}.{pre}.{post}",
    )
    check(what, out, expected, exact)
    ok()

# ----------------------------------------------------------------------------------------------- grouped allreduce
for rep in range(2 if FULL else 1):
    shapes_dtypes = [
        ((5,), torch.float32),
        ((0,), torch.float32),
        ((300, 300), torch.float32),
        ((17,), torch.int64),
        ((3, 3), torch.float16),
        ((1,), torch.uint8),
        ((1001,), torch.bfloat16),
    ]
    inputs = [inputs_for(("grouped", rep, i), s, d, 0, 4) for i, (s, d) in enumerate(shapes_dtypes)]
    expected = [reduce_reference(inp, "Sum", d) for inp, (_, d) in zip(inputs, shapes_dtypes)]
    mine = [inp[me].clone() for inp in inputs]
    outs = hvd.grouped_allreduce(mine, op=hvd.Sum, name=f"grp{rep}")
    for i, (o, e) in enumerate(zip(outs, expected)):
        check(f"grouped_allreduce rep {rep} #{i}", o, e)
        check(f"grouped_allreduce rep {rep} #{i} input untouched", mine[i], inputs[i][me])
    h = hvd.grouped_allreduce_async(mine, op=hvd.Sum)
    outs = hvd.synchronize(h)
    for i, (o, e) in enumerate(zip(outs, expected)):
        check(f"grouped_allreduce_async rep {rep} #{i}", o, e)
    # in place, one member non-contiguous
    work = [m.clone() for m in mine]
    nc = inputs[2][me].clone().t()  # (300, 300) transposed view: non-contiguous
    work[2] = nc
    exp2 = reduce_reference([inputs[2][r].t() for r in range(n)], "Sum", torch.float32)
    res = hvd.grouped_allreduce_(work, op=hvd.Sum, name=f"grpi{rep}")
    for i, w in enumerate(work):
        check(f"grouped_allreduce_ rep {rep} #{i}", w, exp2 if i == 2 else expected[i])
        if res[i] is not w:
            raise AssertionError("grouped_allreduce_ must return the argument tensors")
    # grouped Average with scaling
    avg_in = [inputs_for(("gavg", rep, i), (1000,), torch.float64) for i in range(3)]
    outs = hvd.grouped_allreduce([a[me] for a in avg_in], op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5)
    for i, o in enumerate(outs):
        check(
            f"grouped_allreduce Average scaled #{i}",
            o,
            reduce_reference(avg_in[i], "Average", torch.float64, 2.0, 0.5),
            exact=False,
        )
    ok()


# ----------------------------------------------------------------------------------------------- allgather
def rows_of(r, case):
    return (r * 3 + case) % 5  # 0..4 rows, different per rank; rank 0 has 0 rows in case 0


AG_TRAILING = [(), (3,), (2, 2)] if FULL else [(3,)]
for dtype, trailing, case in itertools.product(DTYPES, AG_TRAILING, [0, 1]):
    key = ("allgather", dtype, trailing, case)
    inputs = [make(r, key, (rows_of(r, case),) + trailing, dtype) for r in range(n)]
    expected = torch.cat(inputs)
    what = f"allgather {dtype} trailing {trailing} case {case} rows {[rows_of(r, case) for r in range(n)]}"
    if case == 0:
        out = hvd.allgather(inputs[me], name=f"ag.{dtype}.{trailing}")
    else:
        out = hvd.synchronize(hvd.allgather_async(inputs[me]))
    check(what, out, expected)
    ok()
# large blocks, different per rank (above the single-copy / ring threshold), every dtype
for dtype in LARGE_DTYPES:
    key = ("allgather-large", dtype)
    inputs = [make(r, key, (200 + 37 * r, 300), dtype) for r in range(n)]
    check(f"allgather large {dtype}", hvd.allgather(inputs[me]), torch.cat(inputs))
    ok()
# scalars: gathered into a vector
for dtype in (torch.float32, torch.int64, torch.bool):
    inputs = [make(r, ("agscalar", dtype), (), dtype) for r in range(n)]
    check(f"allgather scalar {dtype}", hvd.allgather(inputs[me]), torch.stack(inputs))
    ok()
# every rank with zero rows
out = hvd.allgather(torch.zeros(0, 4, dtype=torch.int32))
check("allgather all-empty", out, torch.zeros(0, 4, dtype=torch.int32))
# grouped allgather
g_inputs = [
    [make(r, ("gag", i), ((r + i) % 3, 2), d) for r in range(n)]
    for i, d in enumerate([torch.float32, torch.int8, torch.bool, torch.float64])
]
outs = hvd.grouped_allgather([g[me] for g in g_inputs], name="gag")
for i, (o, g) in enumerate(zip(outs, g_inputs)):
    check(f"grouped_allgather #{i}", o, torch.cat(g))
outs = hvd.synchronize(hvd.grouped_allgather_async([g[me] for g in g_inputs]))
for i, (o, g) in enumerate(zip(outs, g_inputs)):
    check(f"grouped_allgather_async #{i}", o, torch.cat(g))
ok()

# ----------------------------------------------------------------------------------------------- broadcast
bvariants = itertools.cycle(["plain", "inplace", "async", "async_inplace"])
for dtype, size in itertools.product(DTYPES, SIZES):
    # every root for the small sizes; for large ones a root that rotates with the dtype
    if size == "large" and dtype not in LARGE_DTYPES:
        continue
    for root in range(n) if size != "large" else [DTYPES.index(dtype) % n]:
        shape = SHAPES[size]
        key = ("broadcast", dtype, size, root)
        inputs = inputs_for(key, shape, dtype)
        variant = next(bvariants)
        what = f"broadcast[{variant}] {dtype} {size} root {root}"
        mine = inputs[me].clone()
        if variant == "plain":
            out = hvd.broadcast(mine, root, name=f"bc.{dtype}.{size}.{root}")
            check(what + " input untouched", mine, inputs[me])
        elif variant == "inplace":
            out = hvd.broadcast_(mine, root_rank=root)
            if out is not mine:
                raise AssertionError(what + ": broadcast_ must return its argument")
        elif variant == "async":
            out = hvd.synchronize(hvd.broadcast_async(mine, root))
            check(what + " input untouched", mine, inputs[me])
        else:
            out = hvd.synchronize(hvd.broadcast_async_(mine, root, name=f"bca.{dtype}.{size}.{root}"))
            check(what + " in place", mine, inputs[root])
        check(what, out, inputs[root])
        ok()
# non-contiguous in-place broadcast
for root in range(n):
    t = make(me, ("bcnc", root), (40, 30), torch.float32).t()
    hvd.broadcast_(t, root)
    check(f"broadcast_ noncontig root {root}", t, make(root, ("bcnc", root), (40, 30), torch.float32).t())
    ok()


# ----------------------------------------------------------------------------------------------- alltoall
def splits_of(r, case):
    if case == "large":
        return [((r + 2 * j) % 3) * 150 for j in range(n)]  # rows of 300: > 64 KiB blocks, some empty
    return [(r + 2 * j + case) % 4 for j in range(n)]  # includes zeros


A2A_CASES = [0, 1, 2, "large"] if FULL else [1, "large"]
for dtype, case in itertools.product(DTYPES, A2A_CASES):
    if case == "large" and dtype not in LARGE_DTYPES:
        continue
    trailing = (300,) if case == "large" else ((2,) if case != 1 else ())
    splits = [splits_of(r, case) for r in range(n)]
    key = ("alltoall", dtype, case)
    inputs = [make(r, key, (sum(splits[r]),) + trailing, dtype) for r in range(n)]
    pieces = []
    for j in range(n):
        off = sum(splits[j][:me])
        pieces.append(inputs[j][off : off + splits[j][me]])
    expected = torch.cat(pieces)
    expected_splits = torch.tensor([splits[j][me] for j in range(n)], dtype=torch.int32)
    what = f"alltoall {dtype} case {case} splits {splits}"
    if case == 2:
        out, rsplits = hvd.synchronize(hvd.alltoall_async(inputs[me], torch.tensor(splits[me], dtype=torch.int32)))
    else:
        out, rsplits = hvd.alltoall(inputs[me], splits=splits[me], name=f"a2a.{dtype}.{case}")
    check(what, out, expected)
    check(what + " received splits", rsplits, expected_splits)
    ok()
# even split (no splits argument)
for dtype in (torch.float32, torch.int8, torch.bool):
    inputs = [make(r, ("a2a-even", dtype), (3 * n, 5), dtype) for r in range(n)]
    expected = torch.cat([inputs[j][3 * me : 3 * me + 3] for j in range(n)])
    check(f"alltoall even {dtype}", hvd.alltoall(inputs[me]), expected)  # no splits: just the tensor
    out, rsplits = hvd.synchronize(hvd.alltoall_async(inputs[me]))  # the async form always has both
    check(f"alltoall_async even {dtype}", out, expected)
    check(f"alltoall even {dtype} splits", rsplits, torch.full((n,), 3, dtype=torch.int32))
    ok()

# ----------------------------------------------------------------------------------------------- reducescatter
RS_ROWS = [0, 1, n + 1, 7, "large"] if FULL else [n + 1, "large"]
rs_variants = itertools.cycle(["plain", "async", "scaled"])
for dtype, rows, opname in itertools.product(DTYPES, RS_ROWS, OP_NAMES):
    if dtype == torch.bool and opname == "Average":
        continue
    if rows == "large" and (dtype not in LARGE_DTYPES or opname not in ("Sum", "Average", "Min")):
        continue
    shape = (1001, 300) if rows == "large" else ((rows, 3) if rows != 7 else (7,))
    key = ("reducescatter", dtype, rows, opname)
    lo, hi = value_range(opname, dtype)
    inputs = inputs_for(key, shape, dtype, lo, hi)
    variant = next(rs_variants)
    pre, post = (0.5, 2.0) if variant == "scaled" and dtype != torch.bool else (1.0, 1.0)
    full = reduce_reference(inputs, opname, dtype, pre, post)
    split = even_rows(shape[0], n)
    start = sum(split[:me])
    expected = full[start : start + split[me]]
    exact = opname != "Average" or dtype not in FLOAT_DTYPES
    what = f"reducescatter[{variant}] {dtype} shape {shape} {opname} pre={pre} post={post} split {split}"
    if variant == "async":
        out = hvd.synchronize(hvd.reducescatter_async(inputs[me], op=OPS[opname]))
    else:
        out = hvd.reducescatter(
            inputs[me], op=OPS[opname], prescale_factor=pre, postscale_factor=post, name=f"rs.{dtype}.{rows}.{opname}"
        )
    check(what, out, expected, exact)
    ok()
# default op of reducescatter is Average
inputs = inputs_for(("rs-default",), (2 * n + 1, 2), torch.float64)
split = even_rows(2 * n + 1, n)
check(
    "reducescatter default op",
    hvd.reducescatter(inputs[me]),
    reduce_reference(inputs, "Average", torch.float64)[sum(split[:me]) : sum(split[: me + 1])],
    exact=False,
)
# grouped reducescatter
g_inputs = [
    inputs_for(("grs", i), (r_, 2), d, 0, 4)
    for i, (r_, d) in enumerate([(5, torch.float32), (n, torch.int32), (1, torch.float16)])
]
outs = hvd.grouped_reducescatter([g[me] for g in g_inputs], op=hvd.Sum, name="grs")
for i, (o, g) in enumerate(zip(outs, g_inputs)):
    split = even_rows(g[0].shape[0], n)
    check(
        f"grouped_reducescatter #{i}",
        o,
        reduce_reference(g, "Sum", g[0].dtype)[sum(split[:me]) : sum(split[: me + 1])],
    )
outs = hvd.synchronize(hvd.grouped_reducescatter_async([g[me] for g in g_inputs], op=hvd.Max))
for i, (o, g) in enumerate(zip(outs, g_inputs)):
    split = even_rows(g[0].shape[0], n)
    check(
        f"grouped_reducescatter_async #{i}",
        o,
        reduce_reference(g, "Max", g[0].dtype)[sum(split[:me]) : sum(split[: me + 1])],
    )
ok()

# ----------------------------------------------------------------------------------------------- barrier
for _ in range(3):
    hvd.barrier()
ok()

# ----------------------------------------------------------------------------------------------- join
# Rank r runs r + 1 steps, then joins: in step i only ranks >= i submit, the joined ones contribute zeros
# (allreduce) or no rows (allgather); broadcast from a rank that has not joined still works.
for step in range(me + 1):
    s = hvd.allreduce(torch.ones(4, dtype=torch.float32), op=hvd.Sum, name=f"join.ar.{step}")
    check(f"allreduce with {step} joined rank(s)", s, torch.full((4,), float(n - step)))
    g = hvd.allgather(torch.tensor([me], dtype=torch.int64), name=f"join.ag.{step}")
    check(f"allgather with {step} joined rank(s)", g, torch.arange(step, n, dtype=torch.int64))
    b = hvd.broadcast(torch.tensor([me * 10.0]), root_rank=n - 1, name=f"join.bc.{step}")
    check(f"broadcast with {step} joined rank(s)", b, torch.tensor([(n - 1) * 10.0]))
last = hvd.join()
if last != n - 1:
    raise AssertionError(f"join() returned {last}, expected the last rank to join: {n - 1}")
ok()
# everything works normally after join
check("allreduce after join", hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(n)))
ok()

print(f"OK {count}", flush=True)
hvd.shutdown()
