"""Error reporting across ranks: mismatches, bad arguments, peer death, stalls, shutdown and re-init."""

from __future__ import annotations

import os
import re

import pytest
from hvdjob import assert_job_ok, ok_ranks, prelude
from multiproc import run_job

JOBS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")


def job_source(name: str) -> str:
    with open(os.path.join(JOBS_DIR, name), encoding="utf-8") as f:
        return prelude() + f.read()


def inline(body: str) -> str:
    return prelude() + body


def detail(result) -> str:
    return (
        f"exit code {result.returncode}\n--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n"
        f"{result.stderr[-6000:]}"
    )


ERROR_CASES = [
    ("np2", 2, None, {}),
    ("np3", 3, None, {}),
    ("tcp-2hosts-np4", 4, [0, 0, 1, 1], {}),
    ("no-cache-np3", 3, None, {"HVDLITE_CACHE_CAPACITY": "0"}),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_mismatch_and_argument_errors(case):
    """MismatchError on every rank (dtype, shape, op, reduce op, root, pre/postscale, ...), with and without the
    name in the response cache; duplicate in-flight names; bad roots/splits/dtypes/devices; before init."""
    _, np, host_ids, env = case
    result = run_job(job_source("errors.py"), np=np, host_ids=host_ids, env=env, timeout=70)
    assert_job_ok(result, np, min_count=25)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("np", [2, 3])
def test_mismatch_and_argument_errors_on_mpi(np):
    """The same cases with the MPI backend moving the data (negotiation, which finds the mismatches, is the same)."""
    result = run_job(job_source("errors.py"), np=np, env={"EXPECT_BACKEND": "mpi"}, timeout=70, launcher="mpi")
    assert_job_ok(result, np, min_count=25)


# ------------------------------------------------------------------------------------------------ peer death

PEER_DEATH = """
import os, signal, time
import torch
import hvdlite.torch as hvd

hvd.init()
me = hvd.rank()
hvd.allreduce(torch.ones(4), name="warmup")
if me == 1:
    time.sleep(1.0)          # let the others block in the allreduce below
    os._exit(7)
# The starter SIGTERMs the other ranks as soon as rank 1 fails (and SIGKILLs them 5 s later): ignore SIGTERM so
# that this rank can show what hvdlite reports.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
start = time.monotonic()
try:
    hvd.allreduce(torch.ones(1000), name="blocked")
    print("NOERROR", flush=True)
except hvd.HvdliteError as e:
    elapsed = time.monotonic() - start
    print(f"PEERERR {type(e).__name__} {elapsed:.2f} {str(e)!r}", flush=True)
    # after the failure the library must not hang: later calls fail fast, shutdown returns
    t = time.monotonic()
    try:
        hvd.allreduce(torch.ones(2), name="after")
        print("AFTER no error", flush=True)
    except hvd.HvdliteError as e2:
        print(f"AFTER {type(e2).__name__} {time.monotonic() - t:.2f}", flush=True)
    t = time.monotonic()
    hvd.shutdown()
    print(f"SHUTDOWN {time.monotonic() - t:.2f}", flush=True)
"""

PEER_CASES = [
    ("shm-np2", 2, None),
    ("tcp-np2", 2, [0, 1]),
    ("shm-np3", 3, None),
    ("tcp-2hosts-np3", 3, [0, 1, 0]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", PEER_CASES, ids=[c[0] for c in PEER_CASES])
def test_peer_death_is_reported_quickly(case):
    _, np, host_ids = case
    result = run_job(
        inline(PEER_DEATH), np=np, host_ids=host_ids, env={"HVDLITE_PEER_TIMEOUT_SECONDS": "10"}, timeout=40
    )
    info = detail(result)
    assert result.returncode == 7, "the starter must exit with the dead rank's code\n" + info
    survivors = [r for r in range(np) if r != 1]
    errors = ok_ranks(result.stdout, "PEERERR")
    assert sorted(errors) == survivors, "every surviving rank must get an error\n" + info
    for r, rest in errors.items():
        kind, elapsed, message = rest.split(" ", 2)
        assert kind in ("PeerError", "HvdliteTimeoutError"), info
        assert float(elapsed) < 10.0, f"rank {r} took {elapsed} s to notice the dead peer\n" + info
        assert message.strip("'\""), f"rank {r}: empty error message\n" + info
    if np == 2:  # with two ranks the only peer rank 0 can be waiting on is the dead one
        assert re.search(r"rank 1\b", errors[0]), "rank 0's error should name the dead rank 1\n" + info
    after = ok_ranks(result.stdout, "AFTER")
    for r in survivors:
        assert r in after and after[r].startswith(("PeerError", "HvdliteTimeoutError", "AbortedError")), (
            f"rank {r}: a collective after the peer died must fail at once\n" + info
        )
        assert float(after[r].split()[1]) < 5.0, info
    shut = ok_ranks(result.stdout, "SHUTDOWN")
    assert sorted(shut) == survivors, "shutdown() after a peer died must return\n" + info


SILENT_PEER = """
import os, signal, time
import torch
import hvdlite.torch as hvd

hvd.init()
me = hvd.rank()
pids = hvd.allgather(torch.tensor([os.getpid()]), name="pids").tolist()
if me == 1:
    os.kill(os.getpid(), signal.SIGSTOP)   # alive (connections open) but silent
signal.signal(signal.SIGTERM, signal.SIG_IGN)
start = time.monotonic()
try:
    hvd.allreduce(torch.ones(10), name="blocked")
    print("NOERROR", flush=True)
except hvd.HvdliteError as e:
    print(f"SILENT {type(e).__name__} {time.monotonic() - start:.2f} {str(e)!r}", flush=True)
finally:
    os.kill(pids[1], signal.SIGKILL)
"""


@pytest.mark.timeout(60)
def test_silent_peer_times_out_after_peer_timeout():
    """A peer that stops responding (SIGSTOP: connections stay open) fails the others' operations with
    HvdliteTimeoutError after HVDLITE_PEER_TIMEOUT_SECONDS, naming the silent rank."""
    result = run_job(inline(SILENT_PEER), np=2, env={"HVDLITE_PEER_TIMEOUT_SECONDS": "2"}, timeout=40)
    info = detail(result)
    found = ok_ranks(result.stdout, "SILENT")
    assert 0 in found, info
    kind, elapsed, message = found[0].split(" ", 2)
    assert kind == "HvdliteTimeoutError", info
    assert 1.5 < float(elapsed) < 10, info
    assert "rank 1" in message and "HVDLITE_PEER_TIMEOUT_SECONDS" in message, info


# ------------------------------------------------------------------------------------------------ stall

STALL = """
import time
import torch
import hvdlite.torch as hvd
from hvdjob import expect_raises, check, synchronize_within

hvd.init()
n, me = hvd.size(), hvd.rank()
if me == 0:
    start = time.monotonic()
    h = hvd.allreduce_async(torch.ones(2), name="lonely")   # nobody else ever submits it
    e = expect_raises("stalled tensor", hvd.HvdliteTimeoutError, synchronize_within, hvd, h, 12,
                      "allreduce 'lonely' with HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=3",
                      match=["lonely", "stalled", "never submitted"] + [str(r) for r in range(1, n)])
    if not isinstance(e, TimeoutError):
        raise AssertionError("HvdliteTimeoutError must be a TimeoutError")
    print(f"STALL {time.monotonic() - start:.2f}", flush=True)
else:
    time.sleep(1.5)  # then wait in the barrier: rank 0 joins it once its stalled tensor has failed (at ~3 s)
hvd.barrier()
check("after stall", hvd.allreduce(torch.ones(2), op=hvd.Sum, name="x"), torch.full((2,), float(n)))
print("OK 1", flush=True)
"""


@pytest.mark.timeout(60)
def test_stalled_tensor_times_out_with_the_missing_ranks():
    """HVDLITE_STALL_SHUTDOWN_TIME_SECONDS fails a tensor some ranks never submit, naming the missing ranks.

    Bug: the stall check (Controller::report_stalls, called from decide() inside coordinate()) only runs in a
    cycle where some rank has new requests (Controller::negotiate, hvdlite_core/src/runtime/controller.cc:
    ``if ((any & kFlagRequests) || any_conflict || any_joined)``). In the usual hang -- every rank blocked,
    nobody submitting anything new -- neither the stall warning nor the stall shutdown ever fires, so the job
    hangs silently. (It fires as documented when other ranks keep submitting.)
    """
    result = run_job(inline(STALL), np=3, env={"HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"}, timeout=30)
    assert_job_ok(result, 3)
    stall = ok_ranks(result.stdout, "STALL")
    assert 2.5 < float(stall[0]) < 10, detail(result)


# ------------------------------------------------------------------------------------------------ shutdown

SHUTDOWN_REINIT = """
import torch
import hvdlite.torch as hvd
from hvdjob import check, expect_raises

count = 0
for generation in range(3):
    hvd.init()
    hvd.init()  # idempotent while initialised
    n, me = hvd.size(), hvd.rank()
    assert hvd.is_initialized() and n == 2, (n, me)
    x = torch.full((3,), float(me + 1 + generation))
    check(f"allreduce in generation {generation}", hvd.allreduce(x, op=hvd.Sum, name="same.name.every.time"),
          torch.full((3,), float(3 + 2 * generation)))
    check(f"unnamed in generation {generation}", hvd.allgather(torch.tensor([me])), torch.tensor([0, 1]))
    ps = hvd.add_process_set([1])
    if me == 1:
        check("process set after re-init", hvd.allreduce(x, op=hvd.Sum, process_set=ps), x)
    hvd.barrier()
    hvd.shutdown()
    if hvd.is_initialized():
        raise AssertionError("is_initialized() after shutdown")
    for fn, args in ((hvd.rank, ()), (hvd.size, ()), (hvd.local_rank, ()), (hvd.allreduce, (x,)),
                     (hvd.allreduce_, (x,)), (hvd.allgather, (x,)), (hvd.broadcast, (x, 0)),
                     (hvd.alltoall, (x.reshape(3, 1)[:2],)), (hvd.reducescatter, (x,)), (hvd.barrier, ()),
                     (hvd.join, ()), (hvd.add_process_set, ([0],))):
        expect_raises(f"{fn.__name__} after shutdown (generation {generation})", hvd.NotInitializedError, fn,
                      *args)
    hvd.shutdown()  # a second shutdown is harmless
    count += 1
print(f"OK {count}", flush=True)
"""


@pytest.mark.timeout(60)
def test_shutdown_then_calls_fail_and_init_again_works():
    result = run_job(inline(SHUTDOWN_REINIT), np=2, timeout=40)
    assert_job_ok(result, 2, min_count=3)


PENDING_AT_SHUTDOWN = """
import torch
import hvdlite.torch as hvd
from hvdjob import expect_raises

hvd.init()
me = hvd.rank()
h = None
if me == 0:
    h = hvd.allreduce_async(torch.ones(3), name="never.completed")  # rank 1 never submits it
# Only then may rank 1 shut down: with the barrier first, a rank 0 descheduled after it found hvdlite already
# stopped by rank 1 and its enqueue failed instead (seen once in a full run).
hvd.barrier()
hvd.shutdown()
if me == 0:
    expect_raises("operation pending at shutdown", hvd.AbortedError, hvd.synchronize, h,
                  match=["shut down"])
print("OK 1", flush=True)
"""


@pytest.mark.timeout(60)
def test_operation_pending_at_shutdown_fails_with_aborted_error():
    """shutdown()'s docstring: 'Pending operations on every rank fail with AbortedError'.

    Bug: hvdlite_shutdown (hvdlite_core/src/c_api.cc) destroys the Runtime and with it Runtime::handles_; the
    pending handle was failed with kAborted by fail_everything(), but afterwards hvdlite_wait() cannot find it
    (runtime_or_null() is null -> unknown_handle, status 2) and hvdlite_handle_error() returns no message, so
    synchronize() raises InvalidArgumentError('operation failed with status 2') instead of AbortedError.
    """
    result = run_job(inline(PENDING_AT_SHUTDOWN), np=2, timeout=40)
    assert_job_ok(result, 2)


# ------------------------------------------------------------------------------------------------ found bugs

REJECTED_UNNAMED = """
import torch
import hvdlite.torch as hvd
from hvdjob import check, expect_raises, synchronize_within

hvd.init()
n, me = hvd.size(), hvd.rank()
if me == 0:
    # rejected by the core's argument checks (not by Python): no collective was started
    expect_raises("bad root", hvd.InvalidArgumentError, hvd.broadcast, torch.ones(2), n)
    expect_raises("bad splits", hvd.InvalidArgumentError, hvd.alltoall, torch.ones(3), splits=[1] * (n + 1))
# every rank then runs the same unnamed collectives, in the same order
h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum)
check("unnamed allreduce after a rejected request on rank 0",
      synchronize_within(hvd, h, 8, "unnamed allreduce after a rejected unnamed request on rank 0"),
      torch.full((2,), float(n)))
h = hvd.broadcast_async(torch.full((2,), float(me)), 0)
check("unnamed broadcast", synchronize_within(hvd, h, 8, "unnamed broadcast"), torch.zeros(2))
print("OK 1", flush=True)
"""


@pytest.mark.timeout(60)
def test_rejected_unnamed_request_does_not_desynchronise_later_unnamed_collectives():
    """A request the core rejects on one rank must not consume an auto-generated name on that rank only.

    Bug: Runtime::check_request (hvdlite_core/src/runtime/runtime.cc) assigns
    ``<op>.noname.<unnamed_counter_++>`` before validating; when validation then fails on one rank only, that
    rank's later unnamed collectives get different names from the other ranks' and never match: a silent hang
    (the job below reports it after 8 s).
    """
    result = run_job(inline(REJECTED_UNNAMED), np=2, timeout=30)
    assert_job_ok(result, 2)


GROUPED_PARTIAL = """
import torch
import hvdlite.torch as hvd
from hvdjob import check, expect_raises

hvd.init()
n, me = hvd.size(), hvd.rank()
good = torch.ones(1000)
if me == 0:
    # the second member is invalid: the call must fail without leaving the first member in flight
    expect_raises("grouped_allreduce with a bad member", hvd.HvdliteError, hvd.grouped_allreduce,
                  [good.clone(), torch.ones(3, dtype=torch.complex128)], name="ga", op=hvd.Sum)
    expect_raises("grouped_allgather with a bad member", hvd.HvdliteError, hvd.grouped_allgather,
                  [good.clone(), torch.empty(3, device="meta")], name="gg")
    expect_raises("grouped_reducescatter with a bad member", hvd.HvdliteError, hvd.grouped_reducescatter,
                  [good.clone(), torch.ones(3, dtype=torch.bool)], name="gr")  # bool + Average: core rejects it
    expect_raises("grouped_allreduce_ with a bad member", hvd.HvdliteError, hvd.grouped_allreduce_,
                  [good.clone(), torch.ones(3, dtype=torch.complex64)], name="gi")
hvd.barrier()
# every rank now uses the names of the first members: they must be free, and the results correct
check("ga.0", hvd.allreduce(good * (me + 1), op=hvd.Sum, name="ga.0"), good * (n * (n + 1) // 2))
check("gg.0", hvd.allgather(good[:5] * me, name="gg.0"), torch.cat([good[:5] * r for r in range(n)]))
check("gr.0", hvd.allreduce(good, op=hvd.Sum, name="gr.0"), good * n)
check("gi.0", hvd.allreduce(good, op=hvd.Sum, name="gi.0"), good * n)
print("OK 1", flush=True)
"""


@pytest.mark.timeout(60)
def test_grouped_call_with_an_invalid_member_leaves_nothing_in_flight():
    """A grouped call whose later member is rejected must not leave the earlier members enqueued.

    Bug: grouped_allreduce_async / grouped_allreduce_async_ / grouped_allgather_async /
    grouped_reducescatter_async (hvdlite/torch/mpi_ops.py) enqueue member by member; when member k raises
    (Python dtype/device check or the core's check), members 0..k-1 stay in flight in the core with pointers to
    tensors nobody keeps alive (use-after-free once they run; with every rank doing it this corrupted memory and
    crashed a rank with SIGSEGV), and their names stay taken.
    """
    result = run_job(inline(GROUPED_PARTIAL), np=2, timeout=30)
    assert_job_ok(result, 2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("np", [2, 3])
def test_reinit_after_failures_in_a_loop(np):
    """shutdown() + init() in one process, 5 cycles, each after another kind of failure (mismatch, stall on
    every rank, stall of cached tensors on every rank, one rank shutting down under the others): every new
    runtime works, process sets included. A failure must not poison the later cycles."""
    result = run_job(job_source("reinit.py"), np=np, env={"HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"}, timeout=120)
    assert_job_ok(result, np, min_count=5)


# ------------------------------------------------------------------------------------- knobs that must agree

DISAGREEING_KNOBS = """
import os
rank = int(os.environ["HVDLITE_RANK"])
if rank == 2:
    os.environ["HVDLITE_FUSION_THRESHOLD"] = "1024"  # this rank would fuse differently from the others
if rank == 1:
    os.environ["HOROVOD_SMALL_MESSAGE_BYTES"] = "1"  # and this one would pick other algorithms
from hvdlite.common import basics
from hvdlite.common.errors import InvalidArgumentError
try:
    basics.init()
except InvalidArgumentError as error:
    print("REFUSED %d %s" % (rank, str(error).replace(chr(10), " ")), flush=True)
else:
    print("INITIALIZED %d" % rank, flush=True)
"""


@pytest.mark.timeout(60)
def test_knobs_that_must_agree_are_compared_at_init_on_every_rank():
    """Fusion thresholds, cache capacity and algorithm thresholds set differently on some ranks would make ranks run
    different collectives; init refuses on every rank, naming each knob, its values and who has them."""
    result = run_job(DISAGREEING_KNOBS, np=3, timeout=40)
    refused = {}
    for line in result.stdout.splitlines():
        if "REFUSED" in line:
            rank, message = line.split("REFUSED ", 1)[1].split(" ", 1)
            refused[int(rank)] = message
    assert sorted(refused) == [0, 1, 2], result.stdout + result.stderr
    assert len(set(refused.values())) == 1, refused  # the same words everywhere
    message = refused[0]
    assert "HVDLITE_FUSION_THRESHOLD differs between ranks: 1024 on rank 2, 67108864 on ranks 0, 1" in message, (
        message
    )
    assert "HVDLITE_SMALL_MESSAGE_BYTES differs between ranks: 1 on rank 1, 65536 on ranks 0, 2" in message, message
    assert "Every rank must use the same value" in message
