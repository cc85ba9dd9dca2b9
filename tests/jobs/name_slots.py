# Job script: the names' slots (hvdlite_core/src/runtime/fast_slots.h). From its third call, a named asynchronous
# allreduce of a kept request goes through its name's slot, whose handles are of their own kind (bit 62). Every
# way through must give what the ordinary way gives: the results of each operation and dtype with scale factors, a
# name in flight refused on the rank that repeats it, a mismatch between ranks reported on every rank with the name
# usable afterwards, a handle polled, process sets' names through slots of their own and a removed set's error on
# every member, and, after shutdown, handles finished before it and one left pending; a second init gives slots
# again. argv: ROUNDS.
import sys
import time

import torch
from hvdjob import check, expect_raises, make

import hvdlite.torch as hvd

SLOT_BIT = 1 << 62

hvd.init()
n, me = hvd.size(), hvd.rank()
rounds = int(sys.argv[1])
count = 0
# The callers' tensors by name: a kept request is prepared for a tensor's storage, as a training loop's gradients
# keep theirs.
tensors = {}


def expected(key, shape, dtype, op=hvd.Sum, pre=1.0, post=1.0, members=None):
    members = range(n) if members is None else members
    total = sum(make(r, key, shape, dtype).double() for r in members) * pre * post
    return (total / len(members) if op == hvd.Average else total).to(dtype)


def steady_steps(tag, steps, cases, process_set=hvd.global_process_set, members=None):
    """Each step, every case's tensor through allreduce_async_ on process_set (whose ranks are members),
    synchronized afterwards; returns how many of the steps' handles were slots'."""
    global count
    for name, (shape, dtype, _, _, _) in cases.items():
        tensors.setdefault((name, process_set.process_set_id), torch.zeros(shape, dtype=dtype))
    slot_handles = 0
    for step in range(steps):
        handles = []
        for name, (shape, dtype, op, pre, post) in cases.items():
            t = tensors[name, process_set.process_set_id]
            t.copy_(make(me, (tag, name, step), shape, dtype))
            handle = hvd.allreduce_async_(
                t, name=name, op=op, prescale_factor=pre, postscale_factor=post, process_set=process_set
            )
            slot_handles += handle & SLOT_BIT != 0
            handles.append(handle)
        for handle in handles:
            hvd.synchronize(handle)
        for name, (shape, dtype, op, pre, post) in cases.items():
            want = expected((tag, name, step), shape, dtype, op, pre, post, members)
            t = tensors[name, process_set.process_set_id]
            check(f"{tag} {name} step {step}", t, want, exact=not dtype.is_floating_point)
            count += 1
    return slot_handles


cases = {
    "slot.sum": ((4,), torch.float32, hvd.Sum, 1.0, 1.0),
    "slot.average": ((3, 5), torch.float32, hvd.Average, 1.0, 1.0),
    "slot.scaled": ((300,), torch.float64, hvd.Sum, 2.0, 0.25),
    "slot.int": ((7,), torch.int32, hvd.Sum, 1.0, 1.0),
    "slot.kb": ((256,), torch.float32, hvd.Average, 1.0, 1.0),
    "slot.big": ((70000,), torch.float32, hvd.Sum, 1.0, 1.0),  # beyond the fusion of the others
}
# The first two calls of each name go the ordinary way (the second arms the slot); every one after, the slot's.
taken = steady_steps("steady", rounds, cases)
if taken != (rounds - 2) * len(cases):
    raise AssertionError(f"{taken} of the {(rounds - 2) * len(cases)} steady-state handles were slots'")
count += 1

# A name in flight: the second submission is refused on this rank alone, with the name; the first completes. Each
# rank in turn submits first and repeats the name before the barrier the others wait at, so that its operation
# cannot have finished in between (it would then be a new one, rightly taken).
t = tensors["slot.sum", 0]
for first in range(n):
    t.copy_(make(me, ("dup", first), (4,), torch.float32))
    if me == first:
        handle = hvd.allreduce_async_(t, name="slot.sum", op=hvd.Sum)
        assert handle & SLOT_BIT
        expect_raises(
            "a slot's name in flight",
            ValueError,
            hvd.allreduce_async_,
            t.clone(),
            name="slot.sum",
            op=hvd.Sum,
            match=["slot.sum", "already in flight"],
        )
        assert not hvd.poll(handle), "finished before every rank submitted it"
    hvd.barrier()
    if me != first:
        handle = hvd.allreduce_async_(t, name="slot.sum", op=hvd.Sum)
    while not hvd.poll(handle):  # a slot's handle polls as any other; the background thread's cycle finishes it
        time.sleep(0.001)
    hvd.synchronize(handle)
    check(f"the first of the duplicates, rank {first} first", t, expected(("dup", first), (4,), torch.float32))
count += 2

# A mismatch between ranks on a slot's name: the last rank sends another shape (the ordinary way, since its slot
# no longer describes it), the others through the slot. Every rank gets an error naming the tensor and the shapes;
# afterwards the name works again, the ordinary way and then through its slot.
bad_shape = (5,) if me == n - 1 else (4,)
t = make(me, "mismatch", bad_shape, torch.float32)
handle = hvd.allreduce_async_(t, name="slot.sum", op=hvd.Sum)
assert bool(handle & SLOT_BIT) == (me != n - 1)
error = expect_raises(
    "a shape mismatch on a slot's name", hvd.HorovodInternalError, hvd.synchronize, handle, match=["slot.sum"]
)
if "shape" not in str(error).lower():
    raise AssertionError(f"the mismatch error does not name the shapes: {error}")
count += 1
cases_after = {"slot.sum": cases["slot.sum"]}
taken = steady_steps("after mismatch", 4, cases_after)
if taken < 1:
    raise AssertionError("no slot handle after the mismatch")
count += 1

# A dtype mismatch the same way.
t = make(me, "dtype", (4,), torch.float64 if me == 0 else torch.float32)
handle = hvd.allreduce_async_(t, name="slot.sum", op=hvd.Sum)
expect_raises(
    "a dtype mismatch on a slot's name", hvd.HorovodInternalError, hvd.synchronize, handle, match=["slot.sum"]
)
steady_steps("after dtype mismatch", 4, cases_after)
count += 1

# Process sets take the slots too. A name's record, and so its slot, belongs to the set and the name: one set of
# names in two sets that share a rank (three ranks) or in each rank's own set (two). (The callers' cache keeps one
# request a name: a name that moved between sets step by step would be prepared again each time.) A set's members
# run its steps; a rank in two sets runs the first set's, then the second's.
groups = [[0, 1], [1, 2]] if n >= 3 else [[r] for r in range(n)]
sets = [hvd.add_process_set(group) for group in groups]
set_cases = {f"set.{name}": case for name, case in cases.items()}
for group, process_set in zip(groups, sets):
    if me in group:
        taken = steady_steps(f"set {group}", rounds, set_cases, process_set, group)
        if taken != (rounds - 2) * len(cases):
            raise AssertionError(f"set {group}: {taken} of the {(rounds - 2) * len(cases)} handles were slots'")
    count += 1
# A set removed while its names' slots are armed: a caller still holding its id (a ProcessSet kept from before)
# gets an error naming the tensor and the set on every member, and the process goes on.
removed, removed_id = sets[0], sets[0].process_set_id
hvd.remove_process_set(removed)
if me in groups[0]:
    removed.process_set_id = removed_id
    t = tensors["set.slot.sum", removed_id]

    def stale_set_allreduce():
        hvd.synchronize(hvd.allreduce_async_(t, name="set.slot.sum", op=hvd.Sum, process_set=removed))

    expect_raises(
        "a removed set's armed name",
        hvd.InvalidArgumentError,
        stale_set_allreduce,
        match=["set.slot.sum", f"process set {removed_id}"],
    )
    removed.process_set_id = None
hvd.barrier()
steady_steps("after removal", 3, cases_after)
count += 1

# Shutdown: a slot's operation finished and not yet synchronized still synchronizes; one only rank 0 submitted
# fails as shut down.
t = tensors["slot.sum", 0]
t.copy_(make(me, "finished before shutdown", (4,), torch.float32))
finished = hvd.allreduce_async_(t, name="slot.sum", op=hvd.Sum)
assert finished & SLOT_BIT
while not hvd.poll(finished):
    time.sleep(0.001)
pending = None
if me == 0:
    # The others never submit it.
    pending = hvd.allreduce_async_(tensors["slot.kb", 0], name="slot.kb", op=hvd.Average)
    assert pending & SLOT_BIT
hvd.barrier()
hvd.shutdown()
hvd.synchronize(finished)
check("finished before shutdown", t, expected("finished before shutdown", (4,), torch.float32))
if me == 0:
    expect_raises(
        "a slot's operation pending at shutdown", hvd.AbortedError, hvd.synchronize, pending, match=["shut down"]
    )
count += 2

# A second runtime: new records, whose tokens the kept requests may already hold (names queued in the same order get
# the same places); either way the slots are armed again by the third step.
hvd.init()
tensors.clear()
taken = steady_steps("second runtime", 4, cases)
if taken < 2 * len(cases):
    raise AssertionError(f"{taken} of the second runtime's {2 * len(cases)} steady-state handles were slots'")
count += 1
hvd.shutdown()
print(f"OK {count}", flush=True)
