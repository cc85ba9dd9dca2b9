# Job script: error reporting (>= 2 ranks). Before init: NotInitializedError. Mismatches: MismatchError on every
# rank naming the tensor, the ranks and both values; after each error the next collectives still work.
# Local argument errors: InvalidArgumentError / HvdliteError on the offending rank only.
import time

import torch
from hvdjob import CheckFailure, check, check_backend, expect_raises, reduce_reference

import hvdlite.torch as hvd

count = 0


def ok():
    global count
    count += 1


# ---------------------------------------------------------------- before init
if hvd.is_initialized():
    raise CheckFailure("is_initialized() before init")
for fn, args in (
    (hvd.rank, ()),
    (hvd.size, ()),
    (hvd.local_rank, ()),
    (hvd.local_size, ()),
    (hvd.cross_rank, ()),
    (hvd.cross_size, ()),
    (hvd.allreduce, (torch.ones(2),)),
    (hvd.allgather, (torch.ones(2),)),
    (hvd.broadcast, (torch.ones(2), 0)),
    (hvd.alltoall, (torch.ones(2),)),
    (hvd.reducescatter, (torch.ones(2),)),
    (hvd.allreduce_async, (torch.ones(2),)),
    (hvd.barrier, ()),
    (hvd.join, ()),
    (hvd.add_process_set, ([0],)),
):
    e = expect_raises(f"{fn.__name__} before init", hvd.NotInitializedError, fn, *args, match=["init"])
    if not isinstance(e, hvd.HorovodInternalError):
        raise CheckFailure("NotInitializedError must be a HorovodInternalError")
ok()

hvd.init()
check_backend(hvd)
n, me = hvd.size(), hvd.rank()
assert n >= 2
others = f"ranks 1{''.join(', ' + str(r) for r in range(2, n))}" if n > 2 else "rank 1"
step = 0


def still_works():
    """A named and an unnamed collective right after an error, checked."""
    global step
    step += 1
    x = [torch.full((5,), float(r + step)) for r in range(n)]
    check(
        f"allreduce after error #{step}",
        hvd.allreduce(x[me], op=hvd.Sum, name=f"after.{step}"),
        reduce_reference(x, "Sum", torch.float32),
    )
    check(
        f"unnamed allgather after error #{step}",
        hvd.allgather(torch.tensor([me, step])),
        torch.tensor([[r, step] for r in range(n)]).reshape(-1),
    )
    ok()


def expect_mismatch(what, fn, fragments):
    e = expect_raises(what, hvd.MismatchError, fn, match=fragments)
    if not isinstance(e, hvd.HorovodInternalError):
        raise CheckFailure("MismatchError must be a HorovodInternalError")
    still_works()


# ---------------------------------------------------------------- mismatches (every rank must see the error)
for cached in (False, True):
    suffix = ".cached" if cached else ""
    if cached:
        # use every name successfully twice first, so the response cache holds it: the mismatch then arrives
        # as a cache conflict on some ranks only
        for _ in range(2):
            hvd.allreduce(torch.ones(3), name="mm.dtype" + suffix)
            hvd.allreduce(torch.ones(3), name="mm.shape" + suffix)
            hvd.allreduce(torch.ones(3), name="mm.op" + suffix, op=hvd.Sum)
            hvd.allreduce(torch.ones(3), name="mm.redop" + suffix, op=hvd.Sum)
            hvd.broadcast(torch.ones(3), 0, name="mm.root" + suffix)
            hvd.allreduce(torch.ones(3), name="mm.prescale" + suffix, op=hvd.Sum)
            hvd.allreduce(torch.ones(3), name="mm.postscale" + suffix, op=hvd.Sum)
            hvd.allgather(torch.ones(2, 3), name="mm.agshape" + suffix)
            hvd.allreduce_(torch.ones(3), name="mm.inplace" + suffix)

    dtype = torch.float32 if me == 0 else torch.int32
    expect_mismatch(
        f"dtype mismatch{suffix}",
        lambda: hvd.allreduce(torch.ones(3, dtype=dtype), name="mm.dtype" + suffix),
        ["mm.dtype" + suffix, "data type", "rank 0: float32", f"{others}: int32"],
    )
    shape = (4,) if me == n - 1 else (3,)
    last = f"rank {n - 1}"
    firsts = "rank 0" if n == 2 else "ranks " + ", ".join(str(r) for r in range(n - 1))
    expect_mismatch(
        f"shape mismatch{suffix}",
        lambda: hvd.allreduce(torch.ones(shape), name="mm.shape" + suffix),
        ["mm.shape" + suffix, "shape", f"{firsts}: [3]", f"{last}: [4]"],
    )
    # the synchronous in-place allreduce_ enqueues and waits in one call into the core: its error travels too
    expect_mismatch(
        f"in-place shape mismatch{suffix}",
        lambda: hvd.allreduce_(torch.ones(shape), name="mm.inplace" + suffix),
        ["mm.inplace" + suffix, "shape", f"{firsts}: [3]", f"{last}: [4]"],
    )
    expect_mismatch(
        f"op mismatch{suffix}",
        lambda: (
            hvd.allreduce(torch.ones(3), name="mm.op" + suffix, op=hvd.Sum)
            if me == 0
            else hvd.allgather(torch.ones(3), name="mm.op" + suffix)
        ),
        ["mm.op" + suffix, "rank 0: allreduce", f"{others}: allgather"],
    )
    expect_mismatch(
        f"reduce op mismatch{suffix}",
        lambda: hvd.allreduce(torch.ones(3), name="mm.redop" + suffix, op=hvd.Max if me == 0 else hvd.Sum),
        ["mm.redop" + suffix, "reduce op", "rank 0: Max", f"{others}: Sum"],
    )
    expect_mismatch(
        f"root mismatch{suffix}",
        lambda: hvd.broadcast(torch.ones(3), 1 if me == 0 else 0, name="mm.root" + suffix),
        ["mm.root" + suffix, "root rank", "rank 0: 1", f"{others}: 0"],
    )
    expect_mismatch(
        f"prescale mismatch{suffix}",
        lambda: hvd.allreduce(
            torch.ones(3), name="mm.prescale" + suffix, op=hvd.Sum, prescale_factor=0.5 if me == 0 else 1.0
        ),
        ["mm.prescale" + suffix, "prescale", "rank 0: 0.5", f"{others}: 1"],
    )
    expect_mismatch(
        f"postscale mismatch{suffix}",
        lambda: hvd.allreduce(
            torch.ones(3), name="mm.postscale" + suffix, op=hvd.Sum, postscale_factor=2.0 if me == 0 else 1.0
        ),
        ["mm.postscale" + suffix, "postscale", "rank 0: 2", f"{others}: 1"],
    )
    expect_mismatch(
        f"allgather trailing shape mismatch{suffix}",
        lambda: hvd.allgather(torch.ones(2, 3 if me == 0 else 4), name="mm.agshape" + suffix),
        ["mm.agshape" + suffix, "rank 0: 2-d, rows of [3]", f"{others}: 2-d, rows of [4]"],
    )

# unnamed: the core numbers them per kind in call order and caches them by what they carry; with both forms
# already cached each rank's submission is a cache hit, at a different position on the last rank, and the error
# must still come at once, not when the stall limits (seconds) send the hits to the coordinator
PROMPTLY = 10.0
for warm in (False, True):
    suffix = " (both forms cached)" if warm else ""
    if warm:
        for _ in range(3):
            hvd.allreduce(torch.ones(3), op=hvd.Sum)
            hvd.allreduce(torch.ones(4), op=hvd.Sum)
            hvd.broadcast(torch.ones(3), 0)
            hvd.broadcast(torch.ones(3), 1)
    began = time.monotonic()
    expect_mismatch(
        f"unnamed shape mismatch{suffix}",
        lambda: hvd.allreduce(torch.ones(shape), op=hvd.Sum),
        ["allreduce.noname.", "shape", f"{firsts}: [3]", f"{last}: [4]"],
    )
    expect_mismatch(
        f"unnamed root mismatch{suffix}",
        lambda: hvd.broadcast(torch.ones(3), 1 if me == 0 else 0),
        ["broadcast.noname.", "root rank", "rank 0: 1", f"{others}: 0"],
    )
    if time.monotonic() - began > PROMPTLY:
        raise CheckFailure(f"unnamed mismatches{suffix} took {time.monotonic() - began:.1f} s to be reported")
    # two in flight, submitted in another order on rank 0: each rank's first is the other's second
    first, second = (torch.ones(4), torch.ones(3)) if me == 0 else (torch.ones(3), torch.ones(4))
    handles = [hvd.allreduce_async(first, op=hvd.Sum), hvd.allreduce_async(second, op=hvd.Sum)]
    for h in handles:
        expect_raises(f"unnamed order mismatch{suffix}", hvd.MismatchError, hvd.synchronize, h, match=["shape"])
    still_works()
check("unnamed after the mismatches", hvd.allreduce(torch.ones(4), op=hvd.Sum), torch.full((4,), float(n)))
ok()

expect_mismatch(
    "reducescatter shape mismatch",
    lambda: hvd.reducescatter(torch.ones(4 if me == 0 else 5, 2), name="mm.rs", op=hvd.Sum),
    ["mm.rs", "rank 0: [4, 2]", f"{others}: [5, 2]"],
)
expect_mismatch(
    "alltoall trailing shape mismatch",
    lambda: hvd.alltoall(torch.ones(n, 2 if me == 0 else 3), name="mm.a2a"),
    ["mm.a2a", "rank 0: 2-d, rows of [2]", f"{others}: 2-d, rows of [3]"],
)
expect_mismatch(
    "broadcast dtype mismatch",
    lambda: hvd.broadcast(torch.ones(3, dtype=torch.float64 if me == 0 else torch.float16), 0, name="mm.bcdtype"),
    ["mm.bcdtype", "rank 0: float64", f"{others}: float16"],
)
# grouped: only one member mismatches; the error reaches every rank, the other members still complete
expect_mismatch(
    "grouped allreduce member mismatch",
    lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(3 if me == 0 else 4)], name="mm.grp", op=hvd.Sum),
    ["mm.grp.1", "rank 0: [3]", f"{others}: [4]"],
)
# an async mismatch: the error comes from synchronize
expect_mismatch(
    "async mismatch",
    lambda: hvd.synchronize(
        hvd.allreduce_async(torch.ones(3, dtype=torch.float64 if me == 0 else torch.float32), name="mm.async")
    ),
    ["mm.async", "rank 0: float64", f"{others}: float32"],
)
# the names used for mismatches work afterwards with matching arguments
check("mm.dtype reused", hvd.allreduce(torch.ones(3), name="mm.dtype", op=hvd.Sum), torch.full((3,), float(n)))
check(
    "mm.dtype.cached reused",
    hvd.allreduce(torch.ones(3), name="mm.dtype.cached", op=hvd.Sum),
    torch.full((3,), float(n)),
)
ok()

# ---------------------------------------------------------------- duplicate in-flight name: that rank only
x = torch.full((4,), float(me + 1))
expected = torch.full((4,), float(n * (n + 1) // 2))
# rank 0 holds "dup" in flight (the others submit it only after the barrier) and tries to submit it again
if me == 0:
    h = hvd.allreduce_async(x, name="dup", op=hvd.Sum)
    expect_raises(
        "duplicate in-flight name",
        hvd.InvalidArgumentError,
        hvd.allreduce_async,
        x,
        name="dup",
        op=hvd.Sum,
        match=["dup", "already in flight"],
    )
    expect_raises(
        "duplicate in-flight name (in place)",
        hvd.InvalidArgumentError,
        hvd.allreduce_async_,
        x.clone(),
        name="dup",
        op=hvd.Sum,
        match=["dup", "already in flight"],
    )
    expect_raises(
        "duplicate in-flight name (synchronous, in place)",
        hvd.InvalidArgumentError,
        hvd.allreduce_,
        x.clone(),
        name="dup",
        op=hvd.Sum,
        match=["dup", "already in flight"],
    )
    hvd.barrier()
    check("first of the duplicates", hvd.synchronize(h), expected)
else:
    hvd.barrier()
    check("allreduce named dup on other ranks", hvd.allreduce(x, name="dup", op=hvd.Sum), expected)
check("dup name reused after completion", hvd.allreduce(x, name="dup", op=hvd.Sum), expected)
still_works()

# ---------------------------------------------------------------- local argument errors (every rank)
for root in (n, -1, 10**6):
    expect_raises(
        f"broadcast root {root}",
        hvd.InvalidArgumentError,
        hvd.broadcast,
        torch.ones(2),
        root,
        name=f"badroot.{root}",
        match=[f"root rank {root}", "not a member"],
    )
    expect_raises(
        f"broadcast_ root {root}",
        hvd.InvalidArgumentError,
        hvd.broadcast_,
        torch.ones(2),
        root,
        name=f"badroot_.{root}",
    )
# the form the core names unnamed collectives by is reserved: such a name in flight beside an unnamed one of that
# number would be two collectives under one name
expect_raises(
    "a name of the unnamed form",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(2),
    name="allreduce.noname.0",
    match=["'allreduce.noname.0'", "unnamed allreduces", "another name"],
)
check("a name like it for another operation", hvd.allgather(torch.ones(1), name="allreduce.noname.0"), torch.ones(n))
expect_raises(
    "alltoall splits too long",
    hvd.InvalidArgumentError,
    hvd.alltoall,
    torch.ones(n + 1, 2),
    splits=[1] * (n + 1),
    name="a2a.len",
    match=[f"{n + 1} entries", f"{n} ranks"],
)
expect_raises(
    "alltoall splits too short",
    hvd.InvalidArgumentError,
    hvd.alltoall,
    torch.ones(n - 1, 2),
    splits=[1] * (n - 1),
    name="a2a.short",
    match=[f"{n - 1} entries"],
)
expect_raises(
    "alltoall splits wrong sum",
    hvd.InvalidArgumentError,
    hvd.alltoall,
    torch.ones(n + 1, 2),
    splits=[1] * n,
    name="a2a.sum",
    match=[f"sum to {n}", f"first dimension is {n + 1}"],
)
expect_raises(
    "alltoall negative split",
    hvd.InvalidArgumentError,
    hvd.alltoall,
    torch.ones(1, 2),
    splits=[2, -1] + [0] * (n - 2),
    name="a2a.neg",
    match=["negative split"],
)
expect_raises(
    "alltoall uneven without splits",
    hvd.InvalidArgumentError,
    hvd.alltoall,
    torch.ones(n + 1),
    name="a2a.uneven",
    match=["divide evenly"],
)
expect_raises(
    "bool Average",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(3, dtype=torch.bool),
    name="bool.avg",
    match=["Average", "bool"],
)
expect_raises(
    "bool Average reducescatter",
    hvd.InvalidArgumentError,
    hvd.reducescatter,
    torch.ones(3, dtype=torch.bool),
    name="bool.rs.avg",
    match=["Average", "bool"],
)
expect_raises(
    "reducescatter of a scalar",
    hvd.InvalidArgumentError,
    hvd.reducescatter,
    torch.tensor(1.0),
    name="rs.scalar",
    match=["dimension"],
)
expect_raises(
    "Adasum of integers",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(2, dtype=torch.int32),
    name="adasum.int",
    op=hvd.Adasum,
    match=["Adasum", "floating-point", "int32"],
)
expect_raises(
    "Adasum reducescatter",
    hvd.InvalidArgumentError,
    hvd.reducescatter,
    torch.ones(4),
    name="adasum.rs",
    op=hvd.Adasum,
    match=["Adasum", "allreduce only"],
)
if hvd.size() & (hvd.size() - 1):
    expect_raises(
        "Adasum on a non-power-of-two job",
        hvd.InvalidArgumentError,
        hvd.allreduce,
        torch.ones(2),
        name="adasum.np",
        op=hvd.Adasum,
        match=["Adasum", "power-of-two", f"has {hvd.size()}"],
    )
else:
    check("Adasum of equal tensors", hvd.allreduce(torch.ones(2), name="adasum", op=hvd.Adasum), torch.ones(2))
expect_raises("unknown reduce op", ValueError, hvd.allreduce, torch.ones(2), name="op99", op=99)
expect_raises(
    "op and average together", ValueError, hvd.allreduce, torch.ones(2), name="both", op=hvd.Sum, average=True
)
still_works()

# tensors hvdlite cannot take: a clear error naming the problem, raised before anything is enqueued
meta = torch.empty(3, device="meta")
for fn, args in (
    (hvd.allreduce, (meta,)),
    (hvd.allreduce_, (meta,)),
    (hvd.allgather, (meta,)),
    (hvd.broadcast, (meta, 0)),
    (hvd.broadcast_, (meta, 0)),
    (hvd.alltoall, (meta,)),
    (hvd.reducescatter, (meta,)),
    (hvd.grouped_allreduce, ([meta],)),
):
    expect_raises(f"{fn.__name__} of a meta tensor", hvd.HvdliteError, fn, *args, name="meta", match=["meta", "CPU"])
for bad in (
    torch.ones(3, dtype=torch.complex64),
    torch.ones(3, dtype=torch.complex128),
    torch.ones(3, dtype=torch.uint32) if hasattr(torch, "uint32") else torch.ones(3, dtype=torch.complex32),
):
    for fn, args in (
        (hvd.allreduce, (bad,)),
        (hvd.allgather, (bad,)),
        (hvd.broadcast, (bad, 0)),
        (hvd.alltoall, (bad,)),
        (hvd.reducescatter, (bad,)),
    ):
        expect_raises(
            f"{fn.__name__} of {bad.dtype}",
            hvd.HvdliteError,
            fn,
            *args,
            name="baddtype",
            match=[str(bad.dtype), "support"],
        )
still_works()

# a handle can be synchronized once
h = hvd.allreduce_async(torch.ones(2), name="once")
hvd.synchronize(h)
expect_raises("synchronize twice", ValueError, hvd.synchronize, h)
ok()

print(f"OK {count}", flush=True)
hvd.shutdown()
