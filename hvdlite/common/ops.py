"""The one path from Python into the core, framework-neutral, over raw buffers. An adapter describes each
collective as a request tuple (request()) and hands it over with submit(), submit_many() or run(); everything about
the C structs, their cache, handles and errors lives here once.

Results whose size is only known after negotiation (allgather, alltoall, reducescatter) are owned by the core
until the adapter allocates a framework tensor of the reported shape and copies them once (see
docs/architecture.md, "Output buffers").
"""

import array
import functools
import hashlib
import itertools
import struct
import threading
from typing import Callable, Dict, List, Optional, Sequence

from hvdlite.common import binding
from hvdlite.common.binding import check, ffi, lib
from hvdlite.common.errors import HvdliteError, MismatchError, error_for_status

# Horovod's reduce-op constants (same values, so code comparing them keeps working) and the core's codes.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
CORE_REDUCE_OPS = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4, Adasum: 5}

# The core's hvdlite_dtype values (hvdlite.h), by NumPy/TensorFlow dtype name.
DTYPE_CODES = {
    "uint8": 0,
    "int8": 1,
    "int32": 2,
    "int64": 3,
    "float16": 4,
    "bfloat16": 5,
    "float32": 6,
    "float64": 7,
    "bool": 8,
    "uint16": 9,
    "int16": 10,
}


def core_reduce_op(op) -> int:
    try:
        return CORE_REDUCE_OPS[op]
    except (KeyError, TypeError):  # an unhashable op is as unknown as any other
        raise ValueError(f"unknown reduce op {op!r}; use Average, Sum, Adasum, Min, Max or Product") from None


_MAX_DIMS = 64
_HOST_MEMORY, _CUDA_MEMORY = 0, 1  # hvdlite_memory


def request(
    op: int,
    name: Optional[str],
    dtype: int,
    shape: Sequence[int],
    input_ptr: int,
    output_ptr: int,
    root_rank: int = -1,
    reduce_op: int = 0,
    prescale: float = 1.0,
    postscale: float = 1.0,
    process_set_id: int = 0,
    splits: Optional[Sequence[int]] = None,
    device: int = -1,
    stream: int = 0,
) -> tuple:
    """Everything the core needs for one operation, as the tuple that submit(), submit_many() and run() take
    (these positions; hot paths build the tuple themselves). device >= 0: the buffers are CUDA memory on that
    device, produced on ``stream`` (a cudaStream_t as an int; 0: the legacy default stream), and the NCCL data
    plane runs the operation."""
    return (
        op,
        name,
        dtype,
        tuple(shape),
        input_ptr,
        output_ptr,
        root_rank,
        reduce_op,
        prescale,
        postscale,
        process_set_id,
        None if splits is None else tuple(int(s) for s in splits),
        device,
        stream,
    )


# The one cache between Python and the core: requests already built. A training loop submits the same tensors under
# the same names every step, and filling a cffi struct field by field costs more than the core's whole enqueue of
# a small tensor. Keys leave out the buffer addresses, which are passed with each call instead (hvdlite_submit_at):
# an out-of-place result or a tensor allocated anew each step must not add an entry per call, and a cached struct
# is never written, since another thread may be submitting it. A key is an operation on a named tensor
# (prepared()), or one an adapter derives from what the caller passed (hashing fewer fields and translating
# nothing is what a metric averaged every step pays for). Values: (struct, the buffers it points into, the input
# and output addresses it was built with, *facts). An unnamed request is cached too, under what it asks for: the
# core names it anew each time it is queued, not in the struct. Requests with splits change from call to call and
# are built each time instead.
_prepared: Dict[object, tuple] = {}
_PREPARED_LIMIT = 1 << 16  # a model of many thousand tensors must fit: clearing it per step rebuilt them all
cached = _prepared.get  # prepared()'s entry under a key, or None
fast_calls = binding.fast_calls  # hvdlite._fast_calls, or None (binding.py)
# What fast_calls keeps of an entry it read (its steady records) is read again once the entry is replaced or cleared.
_forget = fast_calls.forget if fast_calls is not None else lambda key: None


def prepared_entries() -> dict:
    """prepared()'s cache itself, for fast_calls to look entries up in."""
    return _prepared


def fast_public(fast_function, reference, module: str):
    """A fast call as the public function module.<reference's name>, with the docstring and signature (inspect
    follows __wrapped__) of the Python function it hands every call it does not take. A partial, since a builtin
    function takes no attributes, costs a few nanoseconds a call; a Python wrapper's frame cost a tenth of a
    collective per tensor."""
    public = functools.partial(fast_function)
    functools.update_wrapper(public, reference)
    public.__module__, public.__qualname__ = module, reference.__name__
    # Pickled by that name, as a function is (cloudpickle of a user's function that calls it): by value, a partial
    # would carry its __wrapped__ and the handle table behind it.
    public.__reduce__ = lambda: public.__name__
    return public


def _fill(struct, key: tuple, shape_buf=None, name_buf=None) -> tuple:
    """Writes a request tuple into a hvdlite_request struct; returns the buffers it points into (keep them alive
    with it). shape_buf, name_buf: where to point for the shape and the name, already written (_new_filled)."""
    op, name, dtype, shape, input_ptr, output_ptr, root, reduce_op, prescale, postscale, ps, splits, dev, st = key
    if len(shape) > _MAX_DIMS:
        raise ValueError(f"tensors of more than {_MAX_DIMS} dimensions are not supported")
    if shape_buf is None:
        shape_buf = ffi.new("int64_t[]", shape) if shape else ffi.NULL
    if name_buf is None:
        name_buf = ffi.new("char[]", name.encode()) if name else ffi.NULL
    splits_buf = ffi.new("int32_t[]", splits) if splits is not None else ffi.NULL
    struct.op, struct.name, struct.dtype = op, name_buf, dtype
    struct.ndim, struct.shape = len(shape), shape_buf
    struct.input, struct.output = ffi.cast("void*", input_ptr), ffi.cast("void*", output_ptr)
    struct.root_rank, struct.reduce_op, struct.process_set_id = root, reduce_op, ps
    struct.prescale_factor, struct.postscale_factor = prescale, postscale
    struct.splits, struct.nsplits = splits_buf, 0 if splits is None else len(splits)
    if dev < 0:
        struct.memory, struct.device, struct.stream = _HOST_MEMORY, 0, ffi.NULL
    else:
        struct.memory, struct.device, struct.stream = _CUDA_MEMORY, dev, ffi.cast("void*", st)
    return shape_buf, name_buf, splits_buf


_REQUEST_WORDS = ffi.sizeof("hvdlite_request") // 8  # the struct holds 64-bit fields: a whole number of words


def _new_filled(request: tuple):
    """A new struct for a request tuple, with its shape and name right behind it in one allocation; returns the
    struct and what keeps it alive. The core reads all three on every submission: in one block they are adjacent
    cache lines, where three allocations were three scattered misses once thousands of tensors are in flight."""
    shape, name = request[3], request[1]
    name_bytes = name.encode() if name else b""
    block = ffi.new("uint64_t[]", _REQUEST_WORDS + len(shape) + (len(name_bytes) + 8) // 8)  # zeroed: the NUL
    shape_buf = ffi.cast("int64_t*", block + _REQUEST_WORDS)
    for i, extent in enumerate(shape):
        shape_buf[i] = extent
    name_buf = ffi.cast("char*", block + _REQUEST_WORDS + len(shape))
    ffi.memmove(name_buf, name_bytes, len(name_bytes))
    struct = ffi.cast("hvdlite_request*", block)
    _fill(struct, request, shape_buf if shape else ffi.NULL, name_buf if name else ffi.NULL)
    return struct, block


def prepared(request: tuple, key=None, facts: tuple = ()) -> tuple:
    """(hvdlite_request*, buffers, input address, output address, *facts) for a request tuple, from the cache
    under key when the request has no splits (a cached entry ends with the struct's own address besides); the
    addresses are those the struct holds, which may not be the request's (submit it with the request's own:
    submit_prepared, run_prepared). facts: what the entry is compared by before it is reused. By default the key
    is the request without its addresses."""
    if request[11] is not None:
        struct = _new_request()
        return (struct, _fill(struct, request), request[4], request[5], *facts)
    if key is None:
        key = request[:4] + request[6:]
    replaced = _prepared.get(key)
    if replaced is not None and replaced[4:-1] == facts:
        return replaced
    struct, block = _new_filled(request)
    # Last, the struct's address: where fast_calls finds the request (a C function cannot read a cffi pointer).
    entry = (struct, block, request[4], request[5], *facts, int(ffi.cast("uintptr_t", struct)))
    if len(_prepared) >= _PREPARED_LIMIT:
        _prepared.clear()
        _forget(None)
    elif replaced is not None:
        _forget(key)
    _prepared[key] = entry
    return entry


def layout_digest(shapes: Sequence[Sequence[int]], dtypes: Sequence[str] = ()) -> int:
    """hvdlite_request.layout for tensors of these shapes (and these dtype names, when they differ) packed one
    after another into one buffer: a non-zero 64-bit BLAKE2b digest, the same on every rank and in every process."""
    h = hashlib.blake2b(digest_size=8)
    h.update(b"mixed" if dtypes else b"packed")
    for shape, dtype in itertools.zip_longest(shapes, dtypes):
        if dtype is not None:
            h.update(dtype.encode())
        h.update(struct.pack(f"<q{len(shape)}q", len(shape), *shape))
    return int.from_bytes(h.digest(), "little") or 1


def packed_request(request: tuple, layout: int) -> tuple:
    """prepared()'s entry for an allreduce of several tensors packed into one buffer, built apart from the cache
    (whose structs other callers share): its struct carries the digest of the members' layout, which ranks must
    agree on (hvdlite_request.layout)."""
    struct, block = _new_filled(request)
    struct.layout = layout
    return (struct, block, request[4], request[5])


_from_buffer = ffi.from_buffer
_new_request = functools.partial(ffi.new, "hvdlite_request*")
_submit = lib.hvdlite_submit  # bound once: a cffi attribute lookup costs 0.1 us a call
_submit_at = lib.hvdlite_submit_at
_run = lib.hvdlite_run
_run_at = lib.hvdlite_run_at
_finish = lib.hvdlite_finish
_enqueue_batch = lib.hvdlite_enqueue_batch


def submit(request: tuple) -> int:
    """Queues one operation (request()'s tuple) and returns its core handle; the core copies what it keeps."""
    # The entry is held through the call, until the core has copied the request: an uncached one's buffers die
    # with it.
    return submit_prepared(prepared(request), request[4], request[5])


def submit_prepared(entry: tuple, input_ptr: int, output_ptr: int) -> int:
    """submit() for an entry of the cache (prepared()'s return) on the buffers at these addresses."""
    if entry[2] == input_ptr and entry[3] == output_ptr:
        handle = _submit(entry[0])
    else:
        handle = _submit_at(entry[0], input_ptr, output_ptr)
    if handle < 0:
        check(-handle)
    return handle


def submit_many(requests: Sequence[tuple], layouts: Sequence[int] = ()) -> List[int]:
    """Queues several operations atomically: either all are queued or none is, so a grouped collective with one
    bad member leaves nothing half-submitted. layouts: for each, hvdlite_request.layout (default 0)."""
    count = len(requests)
    if count == 0:
        return []
    structs = ffi.new("hvdlite_request[]", count)
    keep_alive = [prepared(r) for r in requests]  # the entries' buffers live until the core has copied them
    for i, (request, entry) in enumerate(zip(requests, keep_alive)):
        structs[i] = entry[0][0]
        if entry[2] != request[4] or entry[3] != request[5]:
            struct = structs[i]
            struct.input, struct.output = ffi.cast("void*", request[4]), ffi.cast("void*", request[5])
    for i, layout in enumerate(layouts):
        structs[i].layout = layout
    handles = ffi.new("int64_t[]", count)
    check(lib.hvdlite_enqueue_many(structs, count, handles))
    return ffi.unpack(handles, count)


def run(request: tuple, keep_alive) -> None:
    """Queues one operation whose result lands in the caller's buffers and waits for it: one call into the core
    when it finishes within a wait slice. keep_alive holds those buffers should a signal interrupt the wait."""
    run_prepared(prepared(request), keep_alive, request[4], request[5])


def run_prepared(entry: tuple, keep_alive, input_ptr: int, output_ptr: int) -> None:
    """run() for an entry of the cache (prepared()'s return) on the buffers at these addresses. (A framework's
    hottest synchronous path writes this out, with the same two helpers for what is not its steady state.)"""
    try:
        if entry[2] == input_ptr and entry[3] == output_ptr:
            live = _run(entry[0])
        else:
            live = _run_at(entry[0], input_ptr, output_ptr)
    except BaseException:
        run_interrupted(keep_alive)
        raise
    if live != 0:  # 0: finished, and the core needed no handle for it
        run_unfinished(live, keep_alive)


def run_interrupted(keep_alive) -> None:
    """For a run interrupted by a signal handler's exception (Ctrl-C, an alarm), which surfaces as the call
    returns, before its value is stored: the operation may still be running on the caller's buffers."""
    live = lib.hvdlite_last_run()
    if live > 0:
        abandon([live], keep_alive)


def run_unfinished(live: int, keep_alive) -> None:
    """For a run's nonzero return: refused at enqueue (negative), or still running after the wait slice or
    failed (a handle, its error on it)."""
    if live < 0:
        check(-live)
    wait_and_release(live, keep_alive)


def address_array(addresses: Sequence[int]):
    """The addresses as the cffi uintptr_t array gather_bytes and scatter_bytes take: a list passed to them is
    converted on every call, which costs more than the copy of a small tensor, so a caller that packs and unpacks
    the same buffers converts once. (Through array.array: half the cost of cffi's own conversion.)"""
    return ffi.from_buffer("uintptr_t[]", array.array("Q", addresses))


def gather_bytes(destination: int, sources, nbytes) -> None:
    """Packs len(sources) buffers (their addresses: a list, or address_array()'s), nbytes[i] bytes each (a list
    or a cffi int64_t array), one after another at the address destination: many small tensors into one flat
    buffer at memcpy speed."""
    check(lib.hvdlite_gather_bytes(ffi.cast("void*", destination), sources, nbytes, len(sources)))


def scatter_bytes(source: int, destinations, nbytes) -> None:
    """The reverse of gather_bytes: unpacks the flat buffer at source into the buffers at destinations."""
    check(lib.hvdlite_scatter_bytes(ffi.cast("void*", source), destinations, nbytes, len(destinations)))


def describe_members(name: str, members: Sequence[str]) -> None:
    """Tells the timeline that the collective `name` carries the tensors `members` packed together: its spans are
    drawn on each member's row."""
    keep = [ffi.new("char[]", m.encode()) for m in members]
    check(lib.hvdlite_timeline_members(name.encode(), ffi.new("char*[]", keep) if keep else ffi.NULL, len(keep)))


class PreparedBatch:
    """A fixed list of named operations queued again and again, each on the same buffers or on others of the same
    dtype and shape: a DistributedOptimizer's gradients step after step, or one TensorFlow bridge call site, whose
    tensors TensorFlow allocates anew each step. The C requests are built once and nothing per operation is built,
    hashed or handed to the garbage collector while it is in flight. Two ways to queue them:

    - submit_one()/submit_many(), then wait_all(): in-place operations, any subset, passing only their indices and
      buffer addresses (hvdlite_enqueue_batch, which writes the addresses into the core's copy); queue() does the
      same and leaves the waiting to the caller;
    - start(): all of them, in place or not, writing their addresses into the requests (one caller at a time: the
      owner serialises), with one call into the core for a single operation.

    requests: request()'s tuples, named, without splits; their buffer addresses are only placeholders. layouts: for
    each, the digest of the tensors packed in its buffer (hvdlite_request.layout), or 0."""

    def __init__(self, requests: Sequence[tuple], layouts: Optional[Sequence[int]] = None):
        self.count = len(requests)
        self._structs = ffi.new("hvdlite_request[]", max(1, self.count))
        self._buffers = [_fill(self._structs[i], r) for i, r in enumerate(requests)]
        for i, layout in enumerate(layouts or ()):
            self._structs[i].layout = layout
        self._handles = ffi.new("int64_t[]", max(1, self.count))
        self._queued: List[int] = []  # core handles queued by submit_one()/submit_many() since wait_all()

    def submit_one(self, index: int, pointer: int) -> None:
        """Queues operation index on the buffer at pointer (as soon as it is ready, e.g. during backward)."""
        check(_enqueue_batch(self._structs, [index], [pointer], 1, self._handles))
        self._queued.append(self._handles[0])

    def submit_many(self, indices: Sequence[int], pointers: Sequence[int]) -> None:
        """Queues the operations at indices on those buffers, in that order, atomically (all or none)."""
        self._queued += self.queue(indices, pointers)

    def queue(self, indices: Sequence[int], pointers: Sequence[int]) -> List[int]:
        """submit_many() whose core handles are the caller's to wait for, not wait_all()'s. Callers on several
        threads may share the batch: the handles come back in an array of the call's own."""
        count = len(indices)
        if not count:
            return []
        handles = ffi.new("int64_t[]", count)
        check(_enqueue_batch(self._structs, indices, pointers, count, handles))
        return ffi.unpack(handles, count)

    def wait_all(self) -> None:
        """Waits for every operation queued since the last wait_all; raises the first error after all finished.
        Interrupted (Ctrl-C), they stay queued: the next wait_all waits for them again."""
        queued = self._queued
        if not queued:
            return
        handles = ffi.new("int64_t[]", queued)
        while True:
            status = lib.hvdlite_wait_many(handles, len(queued), WAIT_SLICE_SECONDS)
            if status == 0:
                self._queued = []
                return
            if status != _TIMEOUT_STATUS:
                break
            if not all(lib.hvdlite_poll(h) != 0 for h in queued):
                continue  # the slice ran out; signal handlers have run
            break  # finished, one of them by timing out: read each below
        self._queued = []
        error = None
        for h in queued:
            try:
                wait(h)
            except HvdliteError as e:
                error = error or e
            finally:
                release(h)
        if error is not None:
            raise error

    def start(self, buffers: Sequence[tuple], keep_alive) -> List[int]:
        """Queues the requests on buffers[i] = (input, output), C-contiguous objects with the buffer protocol (the
        same object twice: in place), atomically (all or none); returns the core handles still to wait for: none
        when a single operation finished within the first wait slice (one call into the core). keep_alive holds
        the buffers should a signal interrupt that call."""
        structs = self._structs
        for i, (source, destination) in enumerate(buffers):
            struct = structs[i]
            # from_buffer is the cheapest way from a NumPy array to its address (a fifth of .ctypes.data's cost).
            struct.input = _from_buffer(source)
            struct.output = struct.input if destination is source else _from_buffer(destination)
        if self.count != 1:
            check(lib.hvdlite_enqueue_many(structs, self.count, self._handles))
            return ffi.unpack(self._handles, self.count)
        try:
            live = _run(structs)
        except BaseException:  # see run_prepared
            live = lib.hvdlite_last_run()
            if live > 0:
                abandon([live], keep_alive)
            raise
        if live < 0:
            check(-live)
        return [live] if live else []


# A blocking wait returns to Python this often, so that signal handlers run while ranks wait on each other:
# Ctrl-C raises KeyboardInterrupt, a SIGALRM-based timeout (pytest-timeout's) fires. The core keeps working
# on the operation between slices; a slice that ends early costs one extra call per this many seconds.
WAIT_SLICE_SECONDS = 0.1
_TIMEOUT_STATUS = 6  # StatusCode::kTimeout, also what hvdlite_wait returns when the slice ran out


def wait_status(handle: int) -> int:
    """Blocks until the core handle finishes and returns its status. An exception raised by a signal handler
    meanwhile propagates with the operation still running: the caller must keep its buffers alive and must not
    release the handle (``abandon`` does both)."""
    while True:
        status = lib.hvdlite_wait(handle, WAIT_SLICE_SECONDS)
        if status != _TIMEOUT_STATUS:
            return status
        if lib.hvdlite_poll(handle) != 0:
            # Either the operation itself timed out, or it finished between the slice's end and the poll: only
            # a second wait (immediate now) tells, with the operation's own status.
            return lib.hvdlite_wait(handle, WAIT_SLICE_SECONDS)


def wait(handle: int) -> None:
    """Blocks until the core handle finishes; raises its error (the handle stays valid for results)."""
    status = wait_status(handle)
    if status != 0:
        _raise_for(handle, status)


def wait_release_all(handles: Sequence[int]) -> bool:
    """One call into the core for a group of operations: True when all of them finished within a wait slice and
    succeeded, and the core released them; False otherwise, with none released (wait on each for its error)."""
    count = len(handles)
    return count == 0 or lib.hvdlite_wait_many(ffi.new("int64_t[]", handles), count, WAIT_SLICE_SECONDS) == 0


def _raise_for(handle: int, status: int) -> None:
    buf = ffi.new("char[]", 8192)
    n = lib.hvdlite_handle_error(handle, buf, 8192)
    message = ffi.string(buf).decode(errors="replace") if n >= 0 else ""
    raise error_for_status(status, message or f"operation failed with status {status}")


def wait_and_release(handle: int, keep_alive) -> None:
    """wait() then release() for an operation whose result is already in the caller's buffers. Interrupted while
    waiting, the operation is abandoned with keep_alive (its buffers) held until it finishes."""
    try:
        status = wait_status(handle)
    except BaseException:
        abandon([handle], keep_alive)
        raise
    try:
        if status != 0:
            _raise_for(handle, status)
    finally:
        lib.hvdlite_handle_release(handle)


# Operations whose waiter was interrupted and gave them up: their buffers stay referenced until they finish
# (every pending operation finishes: executed, failed, or aborted by shutdown), then their handles are released.
_abandoned_lock = threading.Lock()
_abandoned: List[tuple] = []


def abandon(core_handles: Sequence[int], keep_alive) -> None:
    with _abandoned_lock:
        _abandoned.append((list(core_handles), keep_alive))
    release_finished_abandoned()


def release_finished_abandoned() -> int:
    """Releases abandoned operations that have finished; returns how many are still running."""
    with _abandoned_lock:
        running = []
        for core_handles, keep_alive in _abandoned:
            if all(lib.hvdlite_poll(h) != 0 for h in core_handles):
                for h in core_handles:
                    release(h)
            else:
                running.append((core_handles, keep_alive))
        _abandoned[:] = running
        return len(running)


def output_shape(handle: int) -> List[int]:
    shape = ffi.new("int64_t[]", 32)
    ndim = ffi.new("int32_t*")
    check(lib.hvdlite_handle_output_shape(handle, shape, 32, ndim))
    return [shape[i] for i in range(ndim[0])]


def copy_output(handle: int, destination_ptr: int, nbytes: int) -> None:
    check(lib.hvdlite_handle_output_copy(handle, ffi.cast("void*", destination_ptr), nbytes))


def int_results(handle: int) -> List[int]:
    values = ffi.new("int32_t[]", 4096)
    count = ffi.new("int32_t*")
    check(lib.hvdlite_handle_int_results(handle, values, 4096, count))
    return [values[i] for i in range(min(count[0], 4096))]


def release(handle: int) -> None:
    lib.hvdlite_handle_release(handle)


_NO_RESULT = object()


class HandleTable:
    """Python-level handles: each maps to the core handles it waits for and what synchronize() returns. Keeps the
    framework tensors alive until the operation completes (the core never owns them).

    Two kinds of entry. add_result(): one core handle and a result already at hand (an allreduce into a tensor
    the caller has). Its handle is the core handle itself (positive; the core never reuses one), and it is kept in
    flat dicts, so that an operation in flight adds no object for the garbage collector to trace: a step with
    thousands of tensors in flight otherwise filled the old generations with short-lived bookkeeping and paid
    full collections of the whole heap for it. add(): several core handles or a result built at the end (a
    function), for everything else, under negative handles of its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # add(): -n -> (core handles, finish, keep_alive, reads_handles, recover)
        self._pending: Dict[int, tuple] = {}
        self._finishing: set = set()  # add() handles whose synchronize() is waiting or running finish()
        # add_result(): core handle -> what synchronize() returns. Public: a framework's hottest submission path
        # stores into it directly, as submit_result() does.
        self.results: Dict[int, object] = {}
        self.inputs: Dict[int, object] = {}  # add_result(): core handle -> an input buffer to keep alive besides

    def add(
        self,
        core_handles: List[int],
        finish: Callable[[], object],
        keep_alive=None,
        reads_handles: bool = True,
        recover: Optional[Callable[[MismatchError], object]] = None,
    ) -> int:
        """A handle whose synchronize() waits for core_handles and returns finish(). reads_handles=False: finish
        does not read the core handles (the results are in the caller's buffers), so one call into the core can
        wait for all of them and release them. recover: what synchronize() returns instead of raising when the
        ranks' requests did not match (the core's MismatchError)."""
        handle = -next(self._ids)
        with self._lock:
            self._pending[handle] = (core_handles, finish, keep_alive, reads_handles, recover)
        return handle

    def add_result(self, core_handle: int, result, keep_alive=None) -> int:
        """A handle whose synchronize() returns result once core_handle has finished; result and keep_alive keep
        the operation's buffers alive. (Each dict store is atomic; the handle is unknown to others until
        returned.)"""
        if keep_alive is not None:
            self.inputs[core_handle] = keep_alive
        self.results[core_handle] = result
        return core_handle

    def submit_result(self, entry: tuple, result, pointer: int) -> int:
        """submit_prepared(entry) in place at pointer, then add_result() with result: a gradient's submission in
        one Python call."""
        handle = _submit(entry[0]) if entry[2] == pointer else _submit_at(entry[0], pointer, pointer)
        if handle < 0:
            check(-handle)
        self.results[handle] = result
        return handle

    def pending(self, handle: Optional[int]) -> bool:
        """Whether an add() handle's buffers may still be in use: until its synchronize() has returned or raised."""
        return handle in self._pending or handle in self._finishing

    def poll(self, handle: int) -> bool:
        if handle in self.results:
            return lib.hvdlite_poll(handle) != 0
        with self._lock:
            core_handles = self._pending[handle][0]
        return all(lib.hvdlite_poll(h) != 0 for h in core_handles)

    def synchronize(self, handle: int):
        """Waits for an asynchronous operation and returns its result (raises its error)."""
        result = self.results.pop(handle, _NO_RESULT)
        if result is not _NO_RESULT:  # add_result()'s: the core handle itself
            try:
                status = _finish(handle)  # finished well within the slice: one call, released
            except BaseException:
                self.results[handle] = result  # interrupted: pending under the same handle, as add()'s entries
                raise
            if status == 0:
                if self.inputs:
                    self.inputs.pop(handle, None)
                return result
            return self._synchronize_result(handle, result, status)
        if callable(handle):  # a framework's composite handle (a sparse allreduce's) waits for its own parts
            return handle()
        with self._lock:
            if handle not in self._pending:
                raise ValueError(f"unknown or already synchronized handle {handle}")
            entry = self._pending.pop(handle)
            self._finishing.add(handle)
        try:
            return self._synchronize_entry(handle, entry)
        finally:
            self._finishing.discard(handle)

    def _synchronize_entry(self, handle: int, entry: tuple):
        core_handles, finish, _, reads_handles, recover = entry
        error = None
        released = False
        try:
            released = not reads_handles and wait_release_all(core_handles)
            for h in () if released else core_handles:  # wait for all, even after a failure: no buffer left in use
                try:
                    wait(h)
                except HvdliteError as e:  # re-raised below
                    error = error or e
        except BaseException:
            # Interrupted (Ctrl-C, a signal handler's exception) while the operation runs: it stays pending under
            # the same handle, its tensors alive, so it can be synchronized again (or dropped at shutdown).
            with self._lock:
                self._pending[handle] = entry
            raise
        try:
            if error is not None:
                if recover is not None and isinstance(error, MismatchError):
                    return recover(error)
                raise error
            return finish()
        finally:
            for h in () if released else core_handles:
                release(h)

    def _synchronize_result(self, core: int, result, status: int):
        """synchronize() of an add_result() handle that had not finished well within a slice, or failed."""
        try:
            if status == _TIMEOUT_STATUS:
                status = wait_status(core)
        except BaseException:
            self.results[core] = result  # interrupted: pending under the same handle, as for add()'s entries
            raise
        self.inputs.pop(core, None)
        try:
            if status != 0:
                _raise_for(core, status)
            return result
        finally:
            release(core)
