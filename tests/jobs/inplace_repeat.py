# Job script: a named in-place host allreduce repeated with the same tensor takes a prepared request from a cache
# keyed by its name, after comparing its pointer, the tensor's shape and dtype and the call's arguments with those
# the request was built from (hvdlite/torch/core_ops.py). Every way a later call can differ while sharing some of
# them must still give the right result: a strided view (same
# pointer, shape and dtype, other memory), a view as another dtype, a tensor resized or given
# other storage in place, another op or scale factor, and a process set removed since (an error, not a stale id).
import torch
from hvdjob import check, expect_raises, make

import hvdlite.torch as hvd
from hvdlite.common import ops

hvd.init()
n, me = hvd.size(), hvd.rank()
count = 0


def others(fn):
    """fn(rank) for every rank: each rank computes every rank's input to build the reference."""
    return [fn(r) for r in range(n)]


# A metric averaged every step: the same tensor, name and arguments, a new value each time.
t = torch.zeros(4, 4)
for step in range(50):
    t.copy_(make(me, ("m", step), (4, 4), torch.float32))
    hvd.allreduce_(t, name="m", op=hvd.Sum)
    check(f"m step {step}", t, sum(others(lambda r: make(r, ("m", step), (4, 4), torch.float32))))
    count += 1
if "m" not in ops._prepared:
    raise AssertionError("the repeated allreduce_ did not take the prepared path")

# Every other row of a (8, 4) tensor shares the pointer, shape and dtype of its first four rows, but not its
# memory: after the first four rows went through the cached path, the strided view must not take their request.
base = torch.zeros(8, 4)
top, strided = base[:4], base[::2]
for step in range(3):
    base.copy_(make(me, ("rows", step), (8, 4), torch.float32))
    hvd.allreduce_(top, name="v", op=hvd.Sum)
    count += 1
for step in range(3):
    mine = make(me, ("strided", step), (8, 4), torch.float32)
    base.copy_(mine)
    hvd.allreduce_(strided, name="v", op=hvd.Sum)
    check(
        f"strided view step {step}",
        strided,
        sum(others(lambda r: make(r, ("strided", step), (8, 4), torch.float32)[::2])),
    )
    check(f"rows between the strided view's, step {step}", base[1::2], mine[1::2])
    count += 1

# The same bytes as int32: same pointer and shape, another dtype. The float Max of -1 and -2 is -1; the int32 Max
# of their bit patterns is -2's.
for step in range(3):
    t.fill_(-(me + 1.0))
    hvd.allreduce_(t, name="m", op=hvd.Max)
    check(f"float Max step {step}", t, torch.full((4, 4), -1.0))
    count += 1
t.fill_(-(me + 1.0))
as_int = t.view(torch.int32)
hvd.allreduce_(as_int, name="m", op=hvd.Max)
check("int32 view", as_int, torch.full((4, 4), -float(n)).view(torch.int32))
count += 1

# Other ops and scale factors on the same tensor and name.
for op, pre, post in ((hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 1.0), (hvd.Sum, 1.0, 0.25), (hvd.Min, 1.0, 1.0)):
    for step in range(3):
        t.copy_(make(me, ("o", step), (4, 4), torch.float32))
        hvd.allreduce_(t, name="m", op=op, prescale_factor=pre, postscale_factor=post)
        inputs = torch.stack(others(lambda r: make(r, ("o", step), (4, 4), torch.float32)))
        if op == hvd.Min:
            expected = inputs.min(dim=0).values
        else:
            expected = inputs.sum(dim=0) * pre * post / (n if op == hvd.Average else 1)
        check(f"op {op} pre {pre} post {post} step {step}", t, expected, exact=False)
        count += 1

# Resized in place (a new pointer and shape under the same name), then given other storage of the same shape.
r = torch.zeros(8)
for size in (8, 8, 4096, 4096, 3):
    r.resize_(size)
    r.copy_(make(me, ("r", size), (size,), torch.float32))
    hvd.allreduce_(r, name="r", op=hvd.Sum)
    check(f"resized to {size}", r, sum(others(lambda q: make(q, ("r", size), (size,), torch.float32))))
    count += 1
for step in range(3):
    r.set_(make(me, ("s", step), (3,), torch.float32).clone())
    hvd.allreduce_(r, name="r", op=hvd.Sum)
    check(f"new storage step {step}", r, sum(others(lambda q: make(q, ("s", step), (3,), torch.float32))))
    count += 1

# A process set used, removed, then used again: an error on every rank, not the old id.
members = list(range(n - 1))  # a set other than the global one
subset = hvd.add_process_set(members)
p = torch.zeros(2)
for step in range(3):
    p.fill_(me + step)
    if me in members:
        hvd.allreduce_(p, name="p", op=hvd.Sum, process_set=subset)
        check(f"process set step {step}", p, torch.full((2,), float(sum(members) + len(members) * step)))
    count += 1
hvd.remove_process_set(subset)
expect_raises(
    "allreduce_ on a removed process set",
    ValueError,
    hvd.allreduce_,
    p,
    name="p",
    op=hvd.Sum,
    process_set=subset,
    match=["not registered"],
)
count += 1

# Still usable.
t.fill_(me)
hvd.allreduce_(t, name="m", op=hvd.Sum)
check("after the error", t, torch.full((4, 4), float(sum(range(n)))))
count += 1
print(f"OK {count}", flush=True)
hvd.shutdown()
