# Job script: many named collectives in flight at once (tensor fusion), the same set repeated several times
# (response-cache steady state), with the shapes of some tensors changing between repetitions on every rank or
# on one rank only (cache invalidation), each rank submitting in its own order and with its own pauses.
# argv[1]: number of repetitions. Run with several HVDLITE_CACHE_CAPACITY / HVDLITE_FUSION_THRESHOLD values.
import sys
import time

import torch
from hvdjob import check, even_rows, make, prefill_cache, reduce_reference

import hvdlite.torch as hvd

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
hvd.init()
prefill_cache(hvd)
n, me = hvd.size(), hvd.rank()
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Max": hvd.Max, "Min": hvd.Min, "Product": hvd.Product}
AR_SHAPES = [(1,), (17,), (100,), (3, 7), (0,), (2, 2, 2)]
AR_DTYPES = [torch.float32, torch.int32, torch.float16, torch.float64, torch.int8]
AR_OPS = ["Sum", "Sum", "Sum", "Average", "Max", "Sum", "Product"]
count = 0


def allreduce_specs(rep):
    specs = []
    for i in range(50):
        shape = AR_SHAPES[i % len(AR_SHAPES)]
        if i == 10 and rep >= 3:
            shape = (5, 5)  # every rank changes this tensor's shape from rep 3 on
        specs.append((f"ar.{i}", shape, AR_DTYPES[i % len(AR_DTYPES)], AR_OPS[i % len(AR_OPS)]))
    specs.append(("ar.big0", (100_000,), torch.float32, "Sum"))  # above the small-message threshold
    specs.append(("ar.big1", (40_000,), torch.int64, "Average"))
    return specs


def gather_rows(rank, i, rep):
    rows = (rank + i) % 3
    if rank == n - 1 and rep >= 4 and i == 0:
        rows += 2  # only the last rank changes: a cache conflict on one rank
    return rows


ops = []  # (name, submit() -> handle, check(result))
for rep in range(REPS):
    ops.clear()
    for name, shape, dtype, opname in allreduce_specs(rep):
        key = (name, rep)
        inputs = [
            make(r, key, shape, dtype, 0 if opname == "Product" else -3, 2 if opname == "Product" else 3)
            for r in range(n)
        ]
        expected = reduce_reference(inputs, opname, dtype)
        exact = opname != "Average" or dtype not in (torch.float32, torch.float16, torch.float64)

        def submit(t=inputs[me], name=name, opname=opname):
            return hvd.allreduce_async(t, name=name, op=OPS[opname])

        ops.append((name, submit, lambda out, e=expected, x=exact, w=f"{name} rep {rep}": check(w, out, e, x)))
    for i in range(5):
        name = f"ag.{i}"
        inputs = [make(r, (name, rep), (gather_rows(r, i, rep), 3), torch.float32) for r in range(n)]
        ops.append(
            (
                name,
                lambda t=inputs[me], name=name: hvd.allgather_async(t, name=name),
                lambda out, e=torch.cat(inputs), w=f"{name} rep {rep}": check(w, out, e),
            )
        )
    for i in range(5):
        name = f"bc.{i}"
        root = (i + rep) % n  # the root changes between repetitions: a conflict for every rank
        inputs = [make(r, (name, rep), (9,), torch.int64) for r in range(n)]
        ops.append(
            (
                name,
                lambda t=inputs[me], name=name, root=root: hvd.broadcast_async(t, root, name=name),
                lambda out, e=inputs[root], w=f"{name} rep {rep}": check(w, out, e),
            )
        )
    for i in range(3):
        name = f"a2a.{i}"
        splits = [[(r + j + i + rep) % 3 for j in range(n)] for r in range(n)]
        inputs = [make(r, (name, rep), (sum(splits[r]), 2), torch.float32) for r in range(n)]
        expected = torch.cat([inputs[j][sum(splits[j][:me]) : sum(splits[j][: me + 1])] for j in range(n)])

        def a2a_check(result, e=expected, s=[splits[j][me] for j in range(n)], w=f"{name} rep {rep}"):
            check(w, result[0], e)
            check(w + " splits", result[1], torch.tensor(s, dtype=torch.int32))

        ops.append(
            (name, lambda t=inputs[me], name=name, s=splits[me]: hvd.alltoall_async(t, s, name=name), a2a_check)
        )
    for i in range(3):
        name = f"rs.{i}"
        rows = 2 * n + i
        inputs = [make(r, (name, rep), (rows, 2), torch.float64) for r in range(n)]
        split = even_rows(rows, n)
        expected = reduce_reference(inputs, "Sum", torch.float64)[sum(split[:me]) : sum(split[: me + 1])]
        ops.append(
            (
                name,
                lambda t=inputs[me], name=name: hvd.reducescatter_async(t, name=name, op=hvd.Sum),
                lambda out, e=expected, w=f"{name} rep {rep}": check(w, out, e),
            )
        )
    # unnamed ones too, several in flight (so through the coordinator): every rank submits them in the same relative
    # order
    unnamed = [make(r, ("unnamed", rep), (6,), torch.float32) for r in range(n)]
    # each rank submits in its own order, pausing at rank-dependent points so negotiation cycles differ
    order = ops[me * 7 % len(ops) :] + ops[: me * 7 % len(ops)]
    handles = []
    for k, (name, submit, _) in enumerate(order):
        handles.append((name, submit()))
        if (k + me) % 11 == 0:
            time.sleep(0.002)
        if k == 20:
            handles.append(("unnamed", hvd.allreduce_async(unnamed[me], op=hvd.Sum)))
    checks = {name: chk for name, _, chk in ops}
    checks["unnamed"] = lambda out, e=reduce_reference(unnamed, "Sum", torch.float32): check("unnamed", out, e)
    for name, h in reversed(handles):
        checks[name](hvd.synchronize(h))
        count += 1

print(f"OK {count}", flush=True)
