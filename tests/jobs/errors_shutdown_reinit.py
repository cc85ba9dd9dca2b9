"""After shutdown() every call fails with a clear error, and init() again gives a working runtime."""

import torch
from hvdjob import check, expect_raises

import hvdlite.torch as hvd

count = 0
for generation in range(3):
    hvd.init()
    hvd.init()  # idempotent while initialised
    n, me = hvd.size(), hvd.rank()
    assert hvd.is_initialized() and n == 2, (n, me)
    x = torch.full((3,), float(me + 1 + generation))
    check(
        f"allreduce in generation {generation}",
        hvd.allreduce(x, op=hvd.Sum, name="same.name.every.time"),
        torch.full((3,), float(3 + 2 * generation)),
    )
    check(f"unnamed in generation {generation}", hvd.allgather(torch.tensor([me])), torch.tensor([0, 1]))
    ps = hvd.add_process_set([1])
    if me == 1:
        check("process set after re-init", hvd.allreduce(x, op=hvd.Sum, process_set=ps), x)
    hvd.barrier()
    hvd.shutdown()
    if hvd.is_initialized():
        raise AssertionError("is_initialized() after shutdown")
    for fn, args in (
        (hvd.rank, ()),
        (hvd.size, ()),
        (hvd.local_rank, ()),
        (hvd.allreduce, (x,)),
        (hvd.allreduce_, (x,)),
        (hvd.allgather, (x,)),
        (hvd.broadcast, (x, 0)),
        (hvd.alltoall, (x.reshape(3, 1)[:2],)),
        (hvd.reducescatter, (x,)),
        (hvd.barrier, ()),
        (hvd.join, ()),
        (hvd.add_process_set, ([0],)),
    ):
        expect_raises(f"{fn.__name__} after shutdown (generation {generation})", hvd.NotInitializedError, fn, *args)
    hvd.shutdown()  # a second shutdown is harmless
    count += 1
print(f"OK {count}", flush=True)
