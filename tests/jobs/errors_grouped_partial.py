"""A grouped call whose later member is rejected leaves none of its earlier members in flight."""

import torch
from hvdjob import check, expect_raises

import hvdlite.torch as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
good = torch.ones(1000)
if me == 0:
    # the second member is invalid: the call must fail without leaving the first member in flight
    expect_raises(
        "grouped_allreduce with a bad member",
        hvd.HvdliteError,
        hvd.grouped_allreduce,
        [good.clone(), torch.ones(3, dtype=torch.complex128)],
        name="ga",
        op=hvd.Sum,
    )
    expect_raises(
        "grouped_allgather with a bad member",
        hvd.HvdliteError,
        hvd.grouped_allgather,
        [good.clone(), torch.empty(3, device="meta")],
        name="gg",
    )
    expect_raises(
        "grouped_reducescatter with a bad member",
        hvd.HvdliteError,
        hvd.grouped_reducescatter,
        [good.clone(), torch.ones(3, dtype=torch.bool)],
        name="gr",
    )  # bool + Average: core rejects it
    expect_raises(
        "grouped_allreduce_ with a bad member",
        hvd.HvdliteError,
        hvd.grouped_allreduce_,
        [good.clone(), torch.ones(3, dtype=torch.complex64)],
        name="gi",
    )
hvd.barrier()
# every rank now uses the names of the first members: they must be free, and the results correct
check("ga.0", hvd.allreduce(good * (me + 1), op=hvd.Sum, name="ga.0"), good * (n * (n + 1) // 2))
check("gg.0", hvd.allgather(good[:5] * me, name="gg.0"), torch.cat([good[:5] * r for r in range(n)]))
check("gr.0", hvd.allreduce(good, op=hvd.Sum, name="gr.0"), good * n)
check("gi.0", hvd.allreduce(good, op=hvd.Sum, name="gi.0"), good * n)
print("OK 1", flush=True)
