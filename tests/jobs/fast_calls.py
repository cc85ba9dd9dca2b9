# Job script: the per-tensor calls' steady state in C (hvdlite/common/fast_calls.c) against the Python path that
# serves every other case. A seeded random sequence of allreduces under a few names or none, each call differing
# from the last of its name or not (shape, dtype, op, scale factors, process set, a non-contiguous or a parameter
# tensor, a moved buffer), synchronous (in place or into a new tensor) or asynchronous, its arguments by keyword or
# by position, gives every call its own result; each call's path is counted, and the C one must take most of the
# calls that repeat.
# Then the public C functions' binding of arguments: Python's errors, a keyword handle, the reference's signature.
# argv: CALLS SEED.
import inspect
import pickle
import random
import sys
import threading
import time

import cloudpickle
import torch
from hvdjob import check, make

import hvdlite.torch as hvd
from hvdlite.common import ops

hvd.init()
n, me = hvd.size(), hvd.rank()
calls, seed = int(sys.argv[1]), int(sys.argv[2])
if ops.fast_calls is None:
    raise AssertionError("a source build's package has no fast calls")
# The supported torch's tensor methods are called as their C functions, not through their descriptors.
assert sorted(ops.fast_calls.direct_methods()) == ["data_ptr", "is_contiguous"], ops.fast_calls.direct_methods()
even = hvd.add_process_set([r for r in range(n) if r % 2 == 0])

# What the C calls took: each call's path, from the module's counts of run, submit and finish.
taken = {"run": 0, "submit": 0, "not": 0}


def count(before, after):
    run, submit, _ = (a - b for a, b in zip(after, before))
    taken["run"] += run
    taken["submit"] += submit
    taken["not"] += run + submit == 0


OPS = {"sum": hvd.Sum, "average": hvd.Average, "max": hvd.Max, "none": None}
rng = random.Random(seed)  # the same sequence on every rank
names = [f"fast.{i}" for i in range(4)]
last = {}
parameter = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
pending = []


def expected(key, shape, dtype, op, pre, post, members):
    inputs = torch.stack([make(r, key, shape, dtype) for r in members]).to(torch.float64)
    if op is hvd.Max:
        out = inputs.max(dim=0).values
    else:
        out = inputs.sum(dim=0) * pre * post
        if op in (hvd.Average, None):
            out = out / len(members)
    return out


for i in range(calls):
    name = rng.choice(names)
    form = last.get(name)
    if form is None or rng.random() < 0.15:  # a new form under this name
        form = {
            "shape": rng.choice([(3,), (2, 2), (5,)]),
            "dtype": rng.choice([torch.float32, torch.float64]),
            "op": rng.choice(list(OPS)),
            "scale": rng.choice([(1.0, 1.0), (2.0, 0.5)]),
            "set": rng.choice(["global", "even"]),
        }
        last[name] = form
    kind = rng.choice(["plain"] * 6 + ["strided", "parameter"])
    sync = rng.random() < 0.5
    positional = rng.random() < 0.3  # (tensor, average, name, op, prescale, postscale, process_set)
    by_keyword = rng.random() < 0.2  # synchronize(handle=...)
    into_new = rng.random() < 0.3  # a synchronous call into a new tensor (hvd.allreduce)
    members = list(range(n)) if form["set"] == "global" else [r for r in range(n) if r % 2 == 0]
    if me not in members:
        continue
    key = ("fast", i)
    shape, dtype = form["shape"], form["dtype"]
    value = make(me, key, shape, dtype)
    if kind == "strided":  # a non-contiguous view: the Python path reduces a contiguous copy
        tensor = torch.zeros(shape + (2,), dtype=dtype)[..., 0]
        tensor.copy_(value)
    elif kind == "parameter" and shape == (3,) and dtype == torch.float32:
        tensor = parameter
        tensor.data.copy_(value)
    else:
        tensor = value.clone()
    op = OPS[form["op"]]
    pre, post = form["scale"]
    process_set = hvd.global_process_set if form["set"] == "global" else even
    want = expected(key, shape, dtype, op, pre, post, members).to(dtype)
    tensor_name = None if name == names[0] else f"{name}.{form['set']}"  # one of the names stands for unnamed calls
    arguments = dict(name=tensor_name, op=op, prescale_factor=pre, postscale_factor=post)
    arguments["process_set"] = process_set
    before = ops.fast_calls.taken()
    if sync and into_new:  # the input left as it was
        given = tensor.detach().clone()
        returned = hvd.allreduce(tensor, **arguments)
        count(before, ops.fast_calls.taken())
        assert returned is not tensor and returned.shape == tensor.shape, f"call {i}: allreduce returned {returned}"
        check(f"call {i} ({kind}, into a new tensor, {form})", returned.detach(), want, exact=False)
        check(f"call {i}'s input ({kind}, into a new tensor)", tensor.detach(), given, exact=True)
    elif sync:
        if positional:
            returned = hvd.allreduce_(tensor, None, tensor_name, op, pre, post, process_set)
        else:
            returned = hvd.allreduce_(tensor, **arguments)
        count(before, ops.fast_calls.taken())
        assert returned is tensor, f"call {i}: allreduce_ returned another object"
        check(f"call {i} ({kind}, synchronous, {form})", tensor.detach(), want, exact=False)
    else:
        if positional:
            handle = hvd.allreduce_async_(tensor, None, tensor_name, op, pre, post, process_set)
        else:
            handle = hvd.allreduce_async_(tensor, **arguments)
        count(before, ops.fast_calls.taken())
        result = hvd.synchronize(handle=handle) if by_keyword else hvd.synchronize(handle)
        check(f"call {i} ({kind}, asynchronous, {form})", result.detach(), want, exact=False)
        check(f"call {i}'s tensor ({kind})", tensor.detach(), want, exact=False)

# Repeating calls of one form on contiguous tensors make up about two thirds of this rank's calls: the C calls
# must have taken most of those.
made = sum(taken.values())
if taken["run"] + taken["submit"] < 0.4 * made:
    raise AssertionError(f"the fast calls took {taken} of this rank's {made}")
hvd.barrier()  # the members of the smaller set may still be at work


# A named call finds its entry through the record of the call that followed the last one before it (its steady
# record): the steps below change their names' order, build the names anew (equal, not the same objects), replace an
# entry under a name and clear the whole cache mid-step. Every call gets its result, and the C path takes every call
# of a step whose tensors' forms its name's entry holds.
def steady_step(step, order, shapes, named=lambda i: f"steady.{i}"):
    tensors = [make(me, ("steady", step, i), shapes[i], torch.float32) for i in order]
    before = ops.fast_calls.taken()
    handles = [hvd.allreduce_async_(t, name=named(i), op=hvd.Sum) for t, i in zip(tensors, order)]
    submitted = ops.fast_calls.taken()[1] - before[1]
    for t, h, i in zip(tensors, handles, order):
        want = sum(make(r, ("steady", step, i), shapes[i], torch.float32) for r in range(n))
        check(f"steady step {step}, name {i}", hvd.synchronize(h), want, exact=True)
        check(f"steady step {step}, tensor {i}", t, want, exact=True)
    return submitted


first_names = [f"steady.{i}" for i in range(6)]
shapes = {i: (3,) for i in range(6)}
for step in range(3):  # the first step prepares the entries; later ones are the C path's
    taken_now = steady_step(step, range(6), shapes, named=lambda i: first_names[i])
assert taken_now == 6, taken_now
assert steady_step(3, [5, 0, 3, 1, 4, 2], shapes) == 6  # another order; names equal, new objects
assert steady_step(4, range(6), shapes) == 6
shapes[2] = (2, 2)  # replaced under its name: the Python path prepares it again, then the C path takes it
assert steady_step(5, range(6), shapes) == 5
assert steady_step(6, range(6), shapes) == 6
shapes[2] = (3,)
assert steady_step(7, range(6), shapes) == 5
limit = ops._PREPARED_LIMIT
ops._PREPARED_LIMIT = len(ops.prepared_entries())  # the next new entry clears the cache
shapes[4] = (5,)
assert steady_step(8, range(6), shapes) == 4  # name 4 clears the cache: names 5 and 4 are prepared again
ops._PREPARED_LIMIT = limit
assert steady_step(9, [3, 4, 5, 0, 1, 2], shapes) == 2  # only 4 and 5 were prepared after the clear
assert steady_step(10, range(6), shapes) == 6


class Forgetful(torch.Tensor):
    """A tensor whose read, in the middle of a call the C path takes, clears the cache as prepared() does."""

    def is_contiguous(self, *args, **kwargs):
        ops.prepared_entries().clear()
        ops.fast_calls.forget(None)
        return super().is_contiguous(*args, **kwargs)


for step in range(4):  # even steps prepare the entry, odd ones are the C path's, and their read clears it
    key = ("forgetful", step)
    tensor = make(me, key, (3,), torch.float32).as_subclass(Forgetful)
    before = ops.fast_calls.taken()[1]
    result = hvd.synchronize(hvd.allreduce_async_(tensor, name="steady.forgetful", op=hvd.Sum))
    assert ops.fast_calls.taken()[1] - before == step % 2, (step, ops.fast_calls.taken()[1] - before)
    check(f"forgetful step {step}", result, sum(make(r, key, (3,), torch.float32) for r in range(n)))
hvd.barrier()


# A call the C path runs keeps the GIL, but gives it up while a late rank keeps it waiting: a Python thread of this
# process counts meanwhile. The background threads, idle for a while, sleep long (the test's IDLE_CYCLE_TIME), so
# a synchronous call waits in its exchange until the late rank's own call.
def late_call(what, call, taken_index):
    late = torch.ones(4)
    for _ in range(3):
        call(late)
    time.sleep(0.1)
    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1

    counter = threading.Thread(target=tick)
    counter.start()
    start, ticked = time.monotonic(), ticks[0]
    time.sleep(0.1)  # how fast it counts with the GIL free
    rate = (ticks[0] - ticked) / (time.monotonic() - start)
    if me == n - 1:
        time.sleep(0.5)
    before, ticked, start = ops.fast_calls.taken(), ticks[0], time.monotonic()
    call(late)
    waited, ticked = time.monotonic() - start, ticks[0] - ticked
    stop.set()
    counter.join()
    assert ops.fast_calls.taken()[taken_index] == before[taken_index] + 1, f"{what}: not the C path's"
    check(what, late, torch.ones(4), exact=True)  # averages of ones
    # Held throughout, the GIL would let the thread count only in the switch interval after the call (5 ms).
    if me != n - 1 and not (waited > 0.2 and ticked > 0.2 * rate * waited):
        raise AssertionError(
            f"a thread counted {ticked} while {what} waited {waited:.3f} s for a late rank ({rate:.0f} a second free)"
        )


late_call("allreduce_", lambda t: hvd.allreduce_(t, name="fast.late"), 0)
# Submitted by the C path; its synchronize waits there, or, where a background thread's cycle answered first and the
# wait outlasted a slice, goes on in the Python path, which waits through cffi without the GIL.
late_call("synchronize", lambda t: hvd.synchronize(hvd.allreduce_async_(t, name="fast.late_async")), 1)

# The public functions are the C ones. They bind their arguments as their Python references do, and leave the
# errors to them.
for public in ("allreduce", "allreduce_", "allreduce_async_", "synchronize"):
    assert getattr(hvd, public).func is getattr(ops.fast_calls, public), public
for function in (hvd.allreduce, hvd.allreduce_, hvd.allreduce_async_, hvd.synchronize):
    assert inspect.signature(function) == inspect.signature(function.__wrapped__), function
    assert function.__name__ == function.__wrapped__.__name__, function
    # Pickled by name, as a function is: a function of this script that refers to it travels by value (hvdlite.run)
    assert pickle.loads(cloudpickle.dumps(lambda function=function: function))() is function, function
tensor = torch.ones(3)
for call, message in (
    (lambda: hvd.allreduce_async_(tensor, name="fast.bad", bogus=1), "unexpected keyword argument 'bogus'"),
    (lambda: hvd.allreduce_async_(tensor, None, "fast.bad", name="again"), "multiple values for argument 'name'"),
    (lambda: hvd.allreduce_async_(tensor, None, "fast.bad", None, 1.0, 1.0, hvd.global_process_set, 8), "positional"),
    (lambda: hvd.allreduce_async_(name="fast.bad"), "missing 1 required positional argument: 'tensor'"),
    (lambda: hvd.allreduce_(tensor, name="fast.bad", bogus=1), "unexpected keyword argument 'bogus'"),
    (lambda: hvd.allreduce_(tensor, None, "fast.bad", None, 1.0, 1.0, hvd.global_process_set, 8), "positional"),
    (lambda: hvd.synchronize(), "missing 1 required positional argument: 'handle'"),
    (lambda: hvd.allreduce(tensor, name="fast.bad", bogus=1), "unexpected keyword argument 'bogus'"),
    (lambda: hvd.allreduce(tensor, None, "fast.bad", None, None, 1.0, 1.0, hvd.global_process_set, 8), "positional"),
):
    try:
        call()
    except TypeError as e:
        assert message in str(e), (message, e)
    else:
        raise AssertionError(f"no TypeError ({message})")
hvd.synchronize(hvd.allreduce_async_(tensor, name="fast.after"))  # still usable

# allreduce takes a steady call of a tensor that autograd does not record, uncompressed; the others are its
# reference's: a tensor that requires grad gets a differentiable result, a compressor compresses.
# Each name's request is prepared by a call the C path may take first.
tracked = torch.ones(3, requires_grad=True)
for _ in range(2):
    hvd.allreduce(tracked.detach(), name="fast.tracked")
    before = ops.fast_calls.taken()
    reduced = hvd.allreduce(tracked, name="fast.tracked")
    assert reduced.grad_fn is not None and ops.fast_calls.taken()[0] == before[0], reduced
    hvd.allreduce(tensor, name="fast.fp16")
    before = ops.fast_calls.taken()
    halved = hvd.allreduce(tensor, name="fast.fp16", compression=hvd.Compression.fp16)
    assert halved.dtype == torch.float32 and ops.fast_calls.taken()[0] == before[0], halved
    check("an allreduce through fp16", halved, torch.ones(3), exact=True)
with torch.no_grad():
    hvd.allreduce(tracked, name="fast.untracked")  # prepares the name's request
    before = ops.fast_calls.taken()
    reduced = hvd.allreduce(tracked, name="fast.untracked")
    assert reduced.grad_fn is None and ops.fast_calls.taken()[0] == before[0] + 1, reduced
    check("an allreduce without grad mode", reduced, torch.ones(3), exact=True)
print(f"OK {calls} {taken}", flush=True)
hvd.shutdown()
