# Job script: the Python request cache (hvdlite.common.ops) keeps one entry per named request, whatever buffers the
# calls hand it. Out-of-place results are new tensors every call, metrics are often new tensors every step, and an
# allgathered tensor may change length: each call must reduce into the right buffers, and the cache must grow with
# the distinct requests only, not with the number of calls; unnamed requests too, which the core names anew on each
# call. A request with splits must never be served from an entry built without them.
import torch
from hvdjob import check, make

import hvdlite.torch as hvd
from hvdlite.common import ops
from hvdlite.torch import core_ops, packed_groups

hvd.init()
n, me = hvd.size(), hvd.rank()
count = 0
CALLS = 300


def others(fn):
    return [fn(r) for r in range(n)]


def each_call(step):
    """One round of every kind of call whose buffers change from call to call; returns results to keep."""
    global count
    kept = []
    x = make(me, ("x", step), (5, 3), torch.float32)
    out = hvd.allreduce(x * 1, name="cache.out", op=hvd.Sum)  # a new input and a new output each call
    check(f"allreduce step {step}", out, sum(others(lambda r: make(r, ("x", step), (5, 3), torch.float32))))
    kept.append((out, out.clone()))
    metric = torch.tensor([float(me + step)])  # a metric: a new tensor each step, reduced in place
    hvd.allreduce_(metric, name="cache.metric", op=hvd.Sum)
    check(f"metric step {step}", metric, torch.tensor([float(sum(r + step for r in range(n)))]))
    h = hvd.allreduce_async(x, name="cache.async", op=hvd.Max)
    b = hvd.broadcast_async(make(me, ("b", step), (4,), torch.float64), root_rank=n - 1, name="cache.bcast")
    rows = 1 + step % 4  # a new length under the same name
    g = hvd.allgather_async(torch.full((rows, 2), float(me), dtype=torch.float32), name="cache.gather")
    grouped = hvd.grouped_allreduce([x, x[0].clone()], name="cache.grouped", op=hvd.Sum)
    check(
        f"allreduce_async step {step}",
        hvd.synchronize(h),
        torch.stack(others(lambda r: make(r, ("x", step), (5, 3), torch.float32))).max(0).values,
    )
    check(f"broadcast_async step {step}", hvd.synchronize(b), make(n - 1, ("b", step), (4,), torch.float64))
    check(
        f"allgather_async step {step}",
        hvd.synchronize(g),
        torch.cat([torch.full((rows, 2), float(r)) for r in range(n)]),
    )
    total = sum(others(lambda r: make(r, ("x", step), (5, 3), torch.float32)))
    check(f"grouped step {step}", grouped[0], total)
    check(f"grouped member 1 step {step}", grouped[1], total[0])
    # In place, under one name, on new tensors each call: packed into the group's buffer until the members'
    # shapes change, then into one laid out anew; a strided member is copied in and out by torch.
    width = 2 + step // 100

    def members(r):
        return [make(r, ("g", step, i), (width, i + 1), torch.float32) for i in range(3)]

    mine = members(me)
    strided = step % 7 == 0 and step < 100  # (once the widths change, the batch alone: it adds no request entry)
    if strided:
        mine.append(make(me, ("g", step, "t"), (4, 3), torch.float32).t())
    hvd.grouped_allreduce_(mine, name="cache.grouped_", op=hvd.Sum)
    for i, (got, want) in enumerate(zip(mine, [sum(m) for m in zip(*others(members))])):
        check(f"grouped_ member {i} step {step}", got, want)
    if strided:
        want = sum(make(r, ("g", step, "t"), (4, 3), torch.float32) for r in range(n)).t()
        check(f"grouped_ strided member step {step}", mine[3], want)
    # One name out of place and in place, its dtype and op changing: each call runs the request of its own.
    dtype = torch.float64 if step % 5 == 0 else torch.float32
    op = hvd.Max if step % 3 == 0 else hvd.Sum
    ys = others(lambda r: make(r, ("y", step), (3,), dtype))
    want = torch.stack(ys).max(0).values if op == hvd.Max else sum(ys)
    y = ys[me].clone()
    check(f"shared name out of place step {step}", hvd.allreduce(y, name="cache.shared", op=op), want)
    check(f"shared name input left alone step {step}", y, ys[me])
    check(f"shared name in place step {step}", hvd.allreduce_(y, name="cache.shared", op=op), want)
    # Unnamed: the core names each call anew, so one cached request per kind of call serves them all.
    check(f"unnamed out of place step {step}", hvd.allreduce(x * 1, op=hvd.Sum), total)
    unnamed_metric = torch.tensor([float(me + step)])
    hvd.allreduce_(unnamed_metric, op=hvd.Sum)
    check(f"unnamed metric step {step}", unnamed_metric, torch.tensor([float(sum(r + step for r in range(n)))]))
    check(
        f"unnamed allgather step {step}",
        hvd.allgather(torch.full((rows, 2), float(me), dtype=torch.float32)),
        torch.cat([torch.full((rows, 2), float(r)) for r in range(n)]),
    )
    count += 12
    return kept


held = []
size_after_warmup = None
for step in range(CALLS):
    kept = each_call(step)
    if step % 3 == 0:
        held += kept  # results kept alive, so the allocator must hand later calls other addresses
    if step == 4:
        size_after_warmup = len(ops._prepared)
if len(ops._prepared) != size_after_warmup:
    raise AssertionError(
        f"the request cache grew from {size_after_warmup} to {len(ops._prepared)} entries over {CALLS - 5} calls"
    )
if not any(isinstance(key, tuple) and key[1] is None for key in ops._prepared):
    raise AssertionError("no unnamed request was cached: each unnamed call builds its request anew")
packed = sorted(key[:2] for key in packed_groups._groups)
if packed != [("cache.grouped", 2), ("cache.grouped_", 3), ("cache.grouped_", 4)] or core_ops._group_batches:
    raise AssertionError(f"packed groups: {packed}; member-by-member batches: {sorted(core_ops._group_batches)}")
for i, (out, copy) in enumerate(held):
    check(f"result {i} unchanged by later calls", out, copy)
count += 1


# The same name with and without splits: the entry built without them must not serve the call with them (the
# tensor, name and set are the same).
def rows_of(r):
    return torch.arange(float(2 * n)).reshape(2 * n, 1) + 100 * r


even = hvd.alltoall(rows_of(me), name="cache.a2a")
check("alltoall, even splits", even, torch.cat([rows_of(r)[2 * me : 2 * me + 2] for r in range(n)]))
splits = [n + 1] + [1] * (n - 1)
start = sum(splits[:me])
uneven, received = hvd.alltoall(rows_of(me), splits=torch.tensor(splits, dtype=torch.int32), name="cache.a2a")
check("alltoall, uneven splits", uneven, torch.cat([rows_of(r)[start : start + splits[me]] for r in range(n)]))
if received.tolist() != [splits[me]] * n:
    raise AssertionError(f"rank {me}: received splits {received.tolist()}, expected {[splits[me]] * n}")
even = hvd.alltoall(rows_of(me), name="cache.a2a")
check("alltoall, even splits again", even, torch.cat([rows_of(r)[2 * me : 2 * me + 2] for r in range(n)]))
count += 3
print(f"OK {count}", flush=True)
hvd.shutdown()
