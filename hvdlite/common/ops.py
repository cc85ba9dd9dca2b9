"""Framework-neutral enqueue/wait over raw buffers. Framework adapters turn tensors into (dtype code, shape,
pointer) and back; everything about handles and errors lives here once.

Results whose size is only known after negotiation (allgather, alltoall, reducescatter) are owned by the core
until the adapter allocates a framework tensor of the reported shape and copies them once (see
docs/architecture.md, "Output buffers").
"""

import itertools
import threading
from typing import Callable, Dict, List, Optional, Sequence

from hvdlite.common.binding import check, ffi, lib
from hvdlite.common.errors import HvdliteError, error_for_status

# Horovod's reduce-op constants (same values, so code comparing them keeps working) and the core's codes.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_CORE_REDUCE_OP = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4, Adasum: 5}

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
        return _CORE_REDUCE_OP[op]
    except KeyError:
        raise ValueError(f"unknown reduce op {op!r}; use Average, Sum, Adasum, Min, Max or Product") from None


_MAX_DIMS = 64
_local = threading.local()
_name_cache: Dict[str, object] = {}  # name -> NUL-terminated cdata; names repeat every training step


def _request_buffers():
    """Per-thread request struct and shape array, reused across calls (allocation dominates a small enqueue)."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = (ffi.new("hvdlite_request*"), ffi.new("int64_t[]", _MAX_DIMS), ffi.new("int64_t*"))
    return buffers


def _encoded(name: str):
    cdata = _name_cache.get(name)
    if cdata is None:
        cdata = ffi.new("char[]", name.encode())
        if len(_name_cache) < 100_000:
            _name_cache[name] = cdata
    return cdata


# Requests already built, by everything they say: a training loop submits the same tensors under the same names
# every step, and filling a cffi struct field by field costs more than the core's whole enqueue (1.5 against 1.0 us
# for an 8-byte allreduce). Values: (request, its shape array, its name), kept alive together.
_prepared: Dict[tuple, tuple] = {}
_PREPARED_LIMIT = 4096


def _prepared_request(key: tuple) -> tuple:
    entry = _prepared.get(key)
    if entry is None:
        op, name, dtype, shape, input_ptr, output_ptr, root_rank, reduce_op, prescale, postscale, ps = key
        request = ffi.new("hvdlite_request*")
        shape_buf = ffi.new("int64_t[]", max(1, len(shape)))
        for i, d in enumerate(shape):
            shape_buf[i] = d
        name_buf = ffi.new("char[]", name.encode()) if name else ffi.NULL
        request.op, request.name, request.dtype = op, name_buf, dtype
        request.ndim, request.shape = len(shape), shape_buf
        request.input, request.output = ffi.cast("void*", input_ptr), ffi.cast("void*", output_ptr)
        request.root_rank, request.reduce_op, request.process_set_id = root_rank, reduce_op, ps
        request.prescale_factor, request.postscale_factor = prescale, postscale
        request.splits, request.nsplits = ffi.NULL, 0
        if len(_prepared) >= _PREPARED_LIMIT:
            _prepared.clear()
        entry = _prepared[key] = (request, shape_buf, name_buf)
    return entry


def enqueue(
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
) -> int:
    """Submits one operation to the core and returns its handle (the core copies everything it keeps).
    device >= 0: the buffers are CUDA memory on that device, produced on ``stream`` (a cudaStream_t as an int;
    0: the legacy default stream), and the NCCL data plane runs the operation."""
    if splits is None and name and len(shape) <= _MAX_DIMS and device < 0:
        request = _prepared_request(
            (
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
            )
        )[0]
        handle = _request_buffers()[2]
        check(lib.hvdlite_enqueue(request, handle))
        return handle[0]
    request, shape_buf, handle = _request_buffers()
    ndim = len(shape)
    if ndim > _MAX_DIMS:
        raise ValueError(f"tensors of more than {_MAX_DIMS} dimensions are not supported")
    for i, d in enumerate(shape):
        shape_buf[i] = d
    request.op = op
    request.name = _encoded(name) if name else ffi.NULL
    request.dtype = dtype
    request.ndim = ndim
    request.shape = shape_buf
    request.input = ffi.cast("void*", input_ptr)
    request.output = ffi.cast("void*", output_ptr)
    request.root_rank = root_rank
    request.reduce_op = reduce_op
    request.prescale_factor = prescale
    request.postscale_factor = postscale
    request.process_set_id = process_set_id
    splits_buf = ffi.NULL
    if splits is not None:
        splits_buf = ffi.new("int32_t[]", [int(s) for s in splits])
    request.splits = splits_buf
    request.nsplits = 0 if splits is None else len(splits)
    _place(request, device, stream)
    check(lib.hvdlite_enqueue(request, handle))
    return handle[0]


_HOST_MEMORY, _CUDA_MEMORY = 0, 1  # hvdlite_memory


def _place(request, device: int, stream: int) -> None:
    if device < 0:
        request.memory, request.device, request.stream = _HOST_MEMORY, 0, ffi.NULL
    else:
        request.memory, request.device, request.stream = _CUDA_MEMORY, device, ffi.cast("void*", stream)


def enqueue_many(calls: Sequence[dict]) -> List[int]:
    """Submits several operations atomically (each dict holds enqueue()'s arguments): either all are queued or
    none is, so a grouped collective with one bad member leaves nothing half-submitted."""
    count = len(calls)
    if count == 0:
        return []
    requests = ffi.new("hvdlite_request[]", count)
    keep_alive = []
    for i, call in enumerate(calls):
        request = requests[i]
        shape = list(call["shape"])
        shape_buf = ffi.new("int64_t[]", shape) if shape else ffi.NULL
        keep_alive.append(shape_buf)
        request.op = call["op"]
        request.name = _encoded(call["name"]) if call.get("name") else ffi.NULL
        request.dtype = call["dtype"]
        request.ndim = len(shape)
        request.shape = shape_buf
        request.input = ffi.cast("void*", call["input_ptr"])
        request.output = ffi.cast("void*", call["output_ptr"])
        request.root_rank = call.get("root_rank", -1)
        request.reduce_op = call.get("reduce_op", 0)
        request.prescale_factor = call.get("prescale", 1.0)
        request.postscale_factor = call.get("postscale", 1.0)
        request.process_set_id = call.get("process_set_id", 0)
        splits = call.get("splits")
        if splits is None:
            request.splits = ffi.NULL
            request.nsplits = 0
        else:
            splits_buf = ffi.new("int32_t[]", [int(v) for v in splits])
            keep_alive.append(splits_buf)
            request.splits = splits_buf
            request.nsplits = len(splits)
        _place(request, call.get("device", -1), call.get("stream", 0))
    handles = ffi.new("int64_t[]", count)
    check(lib.hvdlite_enqueue_many(requests, count, handles))
    return [handles[i] for i in range(count)]


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


_enqueue_and_wait = lib.hvdlite_enqueue_and_wait  # bound once: a cffi attribute lookup costs 0.1 us a call


def enqueue_and_wait(
    op: int,
    name: Optional[str],
    dtype: int,
    shape: Sequence[int],
    input_ptr: int,
    output_ptr: int,
    root_rank: int,
    reduce_op: int,
    prescale: float,
    postscale: float,
    process_set_id: int,
    keep_alive,
) -> Optional[tuple]:
    """enqueue() then wait_and_release() for a synchronous host-memory operation whose result lands in the
    caller's buffers, in one call into the core when it finishes within a wait slice (an 8-byte allreduce: two
    fewer foreign calls and no handle bookkeeping in Python). Returns the prepared request it submitted, which a
    caller may keep under a cheaper key of its own and submit again with run_prepared(); None for an unnamed
    operation or one of over 64 dimensions, which are not prepared."""
    if not name or len(shape) > _MAX_DIMS:
        wait_and_release(
            enqueue(
                op,
                name,
                dtype,
                shape,
                input_ptr,
                output_ptr,
                root_rank,
                reduce_op,
                prescale,
                postscale,
                process_set_id,
            ),
            keep_alive,
        )
        return None
    key = (
        op,
        name,
        dtype,
        shape if isinstance(shape, tuple) else tuple(shape),  # torch.Size is a tuple
        input_ptr,
        output_ptr,
        root_rank,
        reduce_op,
        prescale,
        postscale,
        process_set_id,
    )
    prepared = _prepared.get(key) or _prepared_request(key)
    run_prepared(prepared[0], keep_alive)
    return prepared


def run_prepared(request, keep_alive) -> None:
    """Submits a prepared request (enqueue_and_wait's return) and waits for it: one foreign call when the
    operation finishes within a wait slice."""
    try:
        handle = _local.handle
    except AttributeError:
        handle = _local.handle = ffi.new("int64_t*")
    try:
        status = _enqueue_and_wait(request, WAIT_SLICE_SECONDS, handle)
        if status == 0:
            return  # finished, and the core released the handle
        if handle[0] == 0:
            check(status)  # refused at enqueue
        live = handle[0]
    except BaseException:
        # A signal handler's exception (Ctrl-C, an alarm) surfaces as the call returns: the operation may still
        # be running on the caller's buffers.
        if handle[0] != 0:
            abandon([handle[0]], keep_alive)
        raise
    wait_and_release(live, keep_alive)  # still running after the slice, or failed: its error is on the handle


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


class HandleTable:
    """Python-level handles: each maps to the core handles it waits for and a function building the result.
    Keeps the framework tensors alive until the operation completes (the core never owns them)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: Dict[int, tuple] = {}

    def add(self, core_handles: List[int], finish: Callable[[], object], keep_alive=None) -> int:
        handle = next(self._ids)
        with self._lock:
            self._pending[handle] = (core_handles, finish, keep_alive)
        return handle

    def poll(self, handle: int) -> bool:
        with self._lock:
            core_handles = self._pending[handle][0]
        return all(lib.hvdlite_poll(h) != 0 for h in core_handles)

    def synchronize(self, handle: int):
        with self._lock:
            if handle not in self._pending:
                raise ValueError(f"unknown or already synchronized handle {handle}")
            entry = self._pending.pop(handle)
        core_handles, finish, _ = entry
        error = None
        try:
            for h in core_handles:  # wait for all, even after a failure, so no buffer is left in use
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
                raise error
            return finish()
        finally:
            for h in core_handles:
                release(h)
