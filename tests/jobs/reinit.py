# Job script: shutdown() then init() gives a working runtime again, cycle after cycle, whatever failed in the
# cycle before: a mismatch, a tensor stalled on every rank (each rank submits one the others never do), a
# cached tensor stalled on every rank (steady-state training: every tensor is in the response cache), and one
# rank shutting down while the others still have operations pending: these get AbortedError and call init()
# again without shutdown(), which must replace their ended runtime. Process sets are registered anew in
# every cycle. Run with HVDLITE_STALL_SHUTDOWN_TIME_SECONDS set (a few seconds).
# Prepended by the test: sys.path setup so that `import hvdjob` works.
import os
import time

import torch
from hvdjob import check, expect_raises

import hvdlite.torch as hvd

CYCLES = 5
STALL = float(os.environ["HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"])
count = 0


def works(what, n, me, subset):
    """Collectives on the global set and on a process set registered in this cycle."""
    check(
        f"{what}: allreduce",
        hvd.allreduce(torch.full((3,), float(me)), op=hvd.Sum, name="steady"),
        torch.full((3,), float(n * (n - 1) // 2)),
    )
    check(f"{what}: allgather", hvd.allgather(torch.tensor([me]), name="who"), torch.arange(n))
    if me in subset.ranks:
        check(
            f"{what}: allreduce on {subset}",
            hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=subset, name="subset"),
            torch.full((2,), float(len(subset.ranks))),
        )


for cycle in range(CYCLES):
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    subset = hvd.add_process_set(list(range(1, n)))
    if subset.process_set_id is None or subset.ranks != list(range(1, n)):
        raise AssertionError(f"cycle {cycle}: process set not registered: {subset}")
    works(f"cycle {cycle} start", n, me, subset)
    kind = cycle % 4
    if kind == 0:  # a mismatch fails that tensor on every rank, and nothing else
        expect_raises(
            f"cycle {cycle}: mismatch",
            hvd.MismatchError,
            hvd.allreduce,
            torch.ones(2 + me),
            name="mismatched",
            match=["mismatched"],
        )
    elif kind == 1:  # each rank submits a tensor nobody else does: every rank's fails as stalled
        start = time.monotonic()
        h = hvd.allreduce_async(torch.ones(2), name=f"lonely.{me}")
        expect_raises(
            f"cycle {cycle}: stalled",
            hvd.HvdliteTimeoutError,
            hvd.synchronize,
            h,
            match=[f"lonely.{me}", "stalled", "never submitted"],
        )
        if time.monotonic() - start > 4 * STALL + 5:
            raise AssertionError(f"cycle {cycle}: the stall was reported after {time.monotonic() - start:.1f} s")
    elif kind == 2:  # the same with tensors every rank reduced before (cached): only rank r submits cached.r
        for r in range(n):
            hvd.allreduce(torch.ones(2), name=f"cached.{r}")
        start = time.monotonic()
        h = hvd.allreduce_async(torch.ones(2), name=f"cached.{me}")
        expect_raises(
            f"cycle {cycle}: cached tensor stalled",
            hvd.HvdliteTimeoutError,
            hvd.synchronize,
            h,
            match=[f"cached.{me}", "stalled", "never submitted"],
        )
        if time.monotonic() - start > 4 * STALL + 5:
            raise AssertionError(f"cycle {cycle}: the stall was reported after {time.monotonic() - start:.1f} s")
    else:  # rank 0 shuts down while the others still wait for a tensor: they are told, then shut down too
        hvd.barrier()
        if me == 0:
            hvd.shutdown()
            expect_raises(f"cycle {cycle}: rank() after shutdown", hvd.NotInitializedError, hvd.rank)
        else:
            expect_raises(
                f"cycle {cycle}: pending when rank 0 shut down",
                hvd.AbortedError,
                lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(2), name="orphan")),
                match=["another rank shut hvdlite down"],
            )
    if kind != 3:
        works(f"cycle {cycle} after the failure", n, me, subset)
        hvd.barrier()  # the others may still run subset collectives: shutting down now would abort them
        hvd.shutdown()
        expect_raises(f"cycle {cycle}: rank() after shutdown", hvd.NotInitializedError, hvd.rank)
    elif me != 0:
        # Ended by rank 0's shutdown: still initialised (rank() answers, as in Horovod), every operation fails
        # at once, and the init() at the top of the next cycle must start a new runtime without a shutdown().
        if not hvd.is_initialized() or hvd.rank() != me:
            raise AssertionError(f"cycle {cycle}: a runtime ended by another rank's shutdown forgot its rank")
        expect_raises(
            f"cycle {cycle}: after rank 0's shutdown",
            hvd.AbortedError,
            hvd.allreduce,
            torch.ones(1),
            name="after",
            match=["shut hvdlite down"],
        )
    count += 1
    print(f"cycle {cycle} done", flush=True)

hvd.shutdown()
print(f"OK {count}", flush=True)
