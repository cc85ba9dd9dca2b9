"""PyTorch collectives as the core runs them: asynchronous (`op_async` returns a handle for `synchronize`/`poll`),
in-place (`op_`, `op_async_`), never differentiable. Tensors are passed to the core by pointer (contiguous); no
extension is compiled against PyTorch. CPU tensors go to the host data plane; CUDA tensors to the NCCL data plane,
with the current stream of their device, which the core waits on without blocking it.

The layer below the differentiable Functions (autograd.py), which build on these; mpi_ops.py, above both,
holds the synchronous ops that choose between them and re-exports everything under Horovod's module name.
"""

import numbers
import warnings
from typing import Dict, List, Optional

import torch

from hvdlite.common import ops
from hvdlite.common.basics import (
    OP_ALLGATHER,
    OP_ALLREDUCE,
    OP_ALLTOALL,
    OP_BARRIER,
    OP_BROADCAST,
    OP_JOIN,
    OP_REDUCESCATTER,
    global_process_set,
)
from hvdlite.common.errors import InvalidArgumentError
from hvdlite.common.ops import CORE_REDUCE_OPS, Adasum, Average, Sum
from hvdlite.torch import packed_groups
from hvdlite.torch.compression import Compression

_DTYPES = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int32: 2,
    torch.int64: 3,
    torch.float16: 4,
    torch.bfloat16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.bool: 8,
    torch.int16: 10,
}
if hasattr(torch, "uint16"):  # torch >= 2.3
    _DTYPES[torch.uint16] = 9

_handles = ops.HandleTable()
_is_compiling = torch.compiler.is_dynamo_compiling  # torch.compile tracing this call (a constant to eager code)
# hvdlite.torch.compiled_ops, which builds on this module, puts itself here when imported (with hvdlite.torch).
compiled_ops = None
_cached, _run_prepared = ops.cached, ops.run_prepared  # bound once: hot paths
_submit_result = _handles.submit_result
_submit, _submit_at, _check = ops.lib.hvdlite_submit, ops.lib.hvdlite_submit_at, ops.check
_run, _run_at, _run_interrupted, _run_unfinished = (
    ops.lib.hvdlite_run,
    ops.lib.hvdlite_run_at,
    ops.run_interrupted,
    ops.run_unfinished,
)
_result_of_handle = _handles.results  # add_result()'s map, which allreduce_async_'s steady state writes itself


def _describe(name: Optional[str]) -> str:
    return f"tensor '{name}'" if name else "an unnamed tensor"


# ops.request's (device, stream) for a CPU tensor: host memory. The fake-CUDA tests (tests/jobs/nccl_fake.py)
# set it to a device, so that CPU tensors meet everything a CUDA tensor meets below this point.
cpu_placement = (-1, 0)
_HOST = cpu_placement

# The steady state of allreduce_, allreduce_async_ and synchronize in C where it was built (ops.fast_calls): what
# their Python below does, which serves every other case, and every case where it is absent. Only for host tensors:
# the fake-CUDA tests' placement goes the Python way.
_fast = ops.fast_calls


def _placement(tensor: torch.Tensor, name: Optional[str] = None) -> tuple:
    """(device, stream) for ops.request: host memory, or a CUDA device and its current stream."""
    if tensor.is_cpu:  # (is_cpu: a fifth of the cost of device.type, on every collective)
        return cpu_placement
    if tensor.is_cuda:
        return tensor.device.index, torch.cuda.current_stream(tensor.device).cuda_stream
    raise InvalidArgumentError(
        f"{_describe(name)} is on {tensor.device}; hvdlite's collectives take CPU tensors "
        "and CUDA tensors: move it with .cpu() first"
    )


def _dtype_code(tensor: torch.Tensor, name: Optional[str]) -> int:
    try:
        return _DTYPES[tensor.dtype]
    except KeyError:
        raise InvalidArgumentError(
            f"{_describe(name)} has dtype {tensor.dtype}, which hvdlite does not support; "
            f"supported: {', '.join(str(d) for d in _DTYPES)}"
        ) from None


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """tensor, or a contiguous copy. The empty_like of what it returns is contiguous too, and torch's default
    preserve_format makes it for less than naming contiguous_format does."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _resolve_op(op, average) -> int:
    """Horovod's handling of the deprecated average argument (same messages and warning category)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    return Average


def _differentiable(*tensors) -> bool:
    for t in tensors:
        if not isinstance(t, torch.Tensor):  # e.g. the .grad of a parameter before any backward pass
            raise TypeError(f"hvdlite.torch collectives take torch.Tensor inputs, got {type(t).__name__}")
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _compressor(compression):
    return Compression.none if compression is None else compression


def _process_set_id(process_set) -> int:
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered; call hvd.add_process_set first")
    return process_set.process_set_id


def poll(handle) -> bool:
    """True when the asynchronous operation behind handle has finished."""
    if isinstance(handle, SparseAllreduceHandle):
        return handle.poll()
    return _handles.poll(handle)


# The handle table's own method, with no wrapper's frame on each gradient's wait; where the fast calls were built,
# their C function, which finishes an allreduce_async_'s handle and hands everything else to that method. (A sparse
# allreduce's handle, which waits for its two parts, is called.)
synchronize = _handles.synchronize
if _fast is not None:
    _fast.setup(ops.prepared_entries(), _handles.results, _handles.inputs, _HOST, global_process_set, torch.Tensor)
    synchronize = ops.fast_public(_fast.synchronize, synchronize, __name__)


# --------------------------------------------------------------------------- allreduce


def _allreduce_request(tensor, output, name, op, prescale_factor, postscale_factor, process_set) -> tuple:
    """ops.request()'s tuple for an allreduce of contiguous tensor into output. Every allreduce, synchronous or
    not, single or grouped, starts here. A metric averaged every step pays for this on each call, so the common
    case (a supported dtype, a registered set, a known op) is inline; anything else takes the
    checking helpers, which raise the errors."""
    try:
        dtype_code, reduce_op = _DTYPES[tensor.dtype], CORE_REDUCE_OPS[op]
    except (KeyError, TypeError):
        dtype_code, reduce_op = _dtype_code(tensor, name), ops.core_reduce_op(op)
    set_id = process_set.process_set_id
    if set_id is None:
        set_id = _process_set_id(process_set)
    device, stream = cpu_placement if tensor.is_cpu else _placement(tensor, name)
    input_ptr = tensor.data_ptr()
    return (
        OP_ALLREDUCE,
        name,
        dtype_code,
        tensor.shape,
        input_ptr,
        input_ptr if output is tensor else output.data_ptr(),
        -1,
        reduce_op,
        prescale_factor,
        postscale_factor,
        set_id,
        None,
        device,
        stream,
    )


def _prepare_in_place(tensor, name, op, prescale_factor, postscale_factor, process_set):
    """The prepared request (ops.prepared()'s entry) of an in-place allreduce of a named tensor, cached under its
    name, or None when the tensor is not a contiguous host tensor. allreduce_ and allreduce_async_ look the entry
    up themselves and compare what it was prepared from (the entry's facts): a metric averaged every step and
    every gradient take that path on every call."""
    if not (tensor.is_cpu and tensor.is_contiguous()):
        return None
    request = _allreduce_request(
        tensor, tensor, name, Average if op is None else op, prescale_factor, postscale_factor, process_set
    )
    facts = (tensor.dtype, tensor.shape, op, prescale_factor, postscale_factor, request[10], cpu_placement)
    return ops.prepared(request, name, facts)


def _prepared_for_name(tensor, name, op, prescale_factor, postscale_factor, process_set):
    """_prepare_in_place()'s entry, looked up as allreduce_ looks it up: for an out-of-place allreduce of a named
    host tensor, which runs the same request with another output address."""
    known = _cached(name)
    if (
        known is not None
        and known[4] is tensor.dtype
        and known[5] == tensor.shape
        and known[6] == op
        and known[7] == prescale_factor
        and known[8] == postscale_factor
        and known[9] == process_set.process_set_id
        and known[10] is cpu_placement
        and tensor.is_cpu
        and tensor.is_contiguous()
    ):
        return known
    return _prepare_in_place(tensor, name, op, prescale_factor, postscale_factor, process_set)


def _prepared_unnamed(tensor, op, prescale_factor, postscale_factor, process_set):
    """The prepared request of an in-place allreduce of an unnamed contiguous host tensor, cached under what it
    carries (the core names it the same way: decision 024), or None for any other tensor. A metric averaged every
    step without a name takes this path on every call, instead of building and hashing a whole request tuple."""
    if not (tensor.is_cpu and tensor.is_contiguous()):
        return None
    key = (
        tensor.dtype,
        tensor.shape,
        op,
        prescale_factor,
        postscale_factor,
        process_set.process_set_id,
        cpu_placement,
    )
    known = _cached(key)
    if known is None:
        request = _allreduce_request(
            tensor, tensor, None, Average if op is None else op, prescale_factor, postscale_factor, process_set
        )
        # The key doubles as the facts a named entry carries, where fast_calls reads them.
        known = ops.prepared(request, key, key)
    return known


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> int:
    op = _resolve_op(op, average)
    source = _contiguous(tensor)
    output = torch.empty_like(source)
    h = ops.submit(_allreduce_request(source, output, name, op, prescale_factor, postscale_factor, process_set))
    return _handles.add_result(h, output, keep_alive=source)


def allreduce_async_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> int:
    # A gradient's steady state: as in allreduce_, and with the submission (HandleTable.submit_result), written
    # out rather than in helpers, whose calls on this path would cost a twentieth of the whole operation. (Where the
    # fast calls were built, the public function is theirs and comes here only for what it does not take.)
    if name is not None and average is None:
        known = _cached(name)
        if (
            known is not None
            and known[4] is tensor.dtype
            and known[5] == tensor.shape
            and known[6] == op
            and known[7] == prescale_factor
            and known[8] == postscale_factor
            and known[9] == process_set.process_set_id
            and known[10] is cpu_placement
            and tensor.is_cpu
            and tensor.is_contiguous()
        ):
            pointer = tensor.data_ptr()
            handle = _submit(known[0]) if known[2] == pointer else _submit_at(known[0], pointer, pointer)
            if handle < 0:
                _check(-handle)
            _result_of_handle[handle] = tensor
            return handle
        known = _prepare_in_place(tensor, name, op, prescale_factor, postscale_factor, process_set)
        if known is not None:
            return _submit_result(known, tensor, tensor.data_ptr())
    elif average is None:
        known = _prepared_unnamed(tensor, op, prescale_factor, postscale_factor, process_set)
        if known is not None:
            return _submit_result(known, tensor, tensor.data_ptr())
    if average is not None:
        op = _resolve_op(op, average)
    elif op is None:  # the default, without a call: a metric averaged every step pays for each
        op = Average
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    h = ops.submit(_allreduce_request(work, work, name, op, prescale_factor, postscale_factor, process_set))
    if work is tensor:
        return _handles.add_result(h, tensor)
    return _handles.add([h], lambda: tensor.copy_(work), keep_alive=work, reads_handles=False)


def allreduce_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    if _is_compiling():  # traced by torch.compile: one graph node (compiled_ops.py)
        op = _resolve_op(op, average)
        return compiled_ops.allreduce_(tensor, name, op, prescale_factor, postscale_factor, process_set)
    # Synchronous: no Python handle is needed, so the handle table is skipped. A named host tensor's request is
    # cached under its name and reused, on whatever buffer, when what it was prepared from is the same: compared
    # field by field, which costs less than hashing a key of all of them on every call. Its run is
    # ops.run_prepared written out: that call's frame would cost a twentieth of the whole operation. (Where the fast
    # calls were built, the public allreduce_ is their C function, which has tried this call's steady state already.)
    if name is not None and average is None:
        known = _cached(name)
        if (
            known is not None
            and known[4] is tensor.dtype
            and known[5] == tensor.shape
            and known[6] == op
            and known[7] == prescale_factor
            and known[8] == postscale_factor
            and known[9] == process_set.process_set_id
            and known[10] is cpu_placement
            and tensor.is_cpu
            and tensor.is_contiguous()
        ):
            pointer = tensor.data_ptr()
            try:
                live = _run(known[0]) if known[2] == pointer == known[3] else _run_at(known[0], pointer, pointer)
            except BaseException:
                _run_interrupted(tensor)
                raise
            if live != 0:
                _run_unfinished(live, tensor)
            return tensor
        known = _prepare_in_place(tensor, name, op, prescale_factor, postscale_factor, process_set)
        if known is not None:
            pointer = tensor.data_ptr()
            _run_prepared(known, tensor, pointer, pointer)
            return tensor
    elif average is None:
        known = _prepared_unnamed(tensor, op, prescale_factor, postscale_factor, process_set)
        if known is not None:
            pointer = tensor.data_ptr()
            _run_prepared(known, tensor, pointer, pointer)
            return tensor
    if average is not None:
        op = _resolve_op(op, average)
    elif op is None:  # the default, without a call: a metric averaged every step pays for each
        op = Average
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    ops.run(_allreduce_request(work, work, name, op, prescale_factor, postscale_factor, process_set), work)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


# Where the fast calls were built, the public allreduce_async_ and allreduce_ are their C functions, which hand every
# call they do not take to the Python functions above. torch.compile traces a Python stand-in for allreduce_
# (compiled_ops.py).
if _fast is not None:
    _fast.setup_public(
        allreduce_, allreduce_async_, _handles.synchronize, _check, _run_unfinished, _run_interrupted, globals()
    )
    allreduce_async_ = ops.fast_public(_fast.allreduce_async_, allreduce_async_, __name__)
    allreduce_ = ops.fast_public(_fast.allreduce_, allreduce_, __name__)


def _allreduce_sync(tensor, name, op, prescale_factor, postscale_factor, process_set):
    """The reduced copy of tensor, waited for: the synchronous, non-differentiable allreduce (a metric, a loss)."""
    source = _contiguous(tensor)
    output = torch.empty_like(source)
    key = _allreduce_request(source, output, name, op, prescale_factor, postscale_factor, process_set)
    ops.run(key, (source, output))
    return output


def _group_names(name, count):
    return [None] * count if name is None else [f"{name}.{i}" for i in range(count)]


def _grouped_allreduce(tensors, op, name, prescale_factor, postscale_factor, process_set, in_place: bool) -> int:
    """A grouped allreduce of host tensors as one packed operation (packed_groups), else member by member; the
    fake-CUDA tests' host tensors, which stand for device memory, are never packed."""
    tensors = list(tensors)
    each = _grouped_allreduce_each_ if in_place else _grouped_allreduce_each
    if op != Adasum and cpu_placement == _HOST:  # (Adasum's result is not elementwise)
        handle = packed_groups.queue(
            tensors,
            name,
            (name, len(tensors), op, prescale_factor, postscale_factor, process_set.process_set_id),
            lambda flat, flat_name: _allreduce_request(
                flat, flat, flat_name, op, prescale_factor, postscale_factor, process_set
            ),
            lambda members: each(members, name, op, prescale_factor, postscale_factor, process_set),
            _handles,
            in_place,
        )
        if handle is not None:
            return handle
    return each(tensors, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> int:
    op = _resolve_op(op, average)
    return _grouped_allreduce(tensors, op, name, prescale_factor, postscale_factor, process_set, False)


def _grouped_allreduce_each(tensors, name, op, prescale_factor, postscale_factor, process_set) -> int:
    """A grouped allreduce into new tensors as one core operation per member."""
    sources = [_contiguous(t) for t in tensors]
    outputs = [torch.empty_like(s) for s in sources]
    handles = ops.submit_many(
        [
            _allreduce_request(s, o, n, op, prescale_factor, postscale_factor, process_set)
            for s, o, n in zip(sources, outputs, _group_names(name, len(sources)))
        ]
    )
    return _handles.add(handles, lambda: outputs, keep_alive=sources, reads_handles=False)


# The prepared batches of named in-place groups, under (name, member count, op, scale factors, process set id),
# each with the members' dtypes and shapes it was prepared for: a group reduced step after step then costs a read
# of each member's layout and address, not a request built and looked up for each.
_group_batches: Dict[tuple, tuple] = {}
_GROUP_BATCH_LIMIT = 1024


def _queue_prepared_group(tensors, name, op, prescale_factor, postscale_factor, process_set):
    """The core handles of an in-place grouped allreduce queued through the group's prepared batch (prepared
    now if need be); None unless the group is named and every member is a contiguous host tensor."""
    set_id = process_set.process_set_id
    if name is None or set_id is None:
        return None
    key = (name, len(tensors), op, prescale_factor, postscale_factor, set_id)
    known = _group_batches.get(key)
    pointers = []
    # Nothing is built per member that outlives its iteration: a list of thousands of live tuples a call set off
    # the garbage collector's full passes over the whole heap.
    for t, dtype, shape in zip(tensors, *known[1:3]) if known is not None else ():
        if not (t.is_cpu and t.is_contiguous()):
            return None
        if t.dtype is not dtype or t.shape != shape:
            known = None
            break
        pointers.append(t.data_ptr())
    if known is None:
        if not all(t.is_cpu and t.is_contiguous() for t in tensors):
            return None
        requests = [
            _allreduce_request(t, t, n, op, prescale_factor, postscale_factor, process_set)
            for t, n in zip(tensors, _group_names(name, len(tensors)))
        ]
        if len(_group_batches) >= _GROUP_BATCH_LIMIT:
            _group_batches.clear()
        dtypes, shapes = [t.dtype for t in tensors], [t.shape for t in tensors]
        known = _group_batches[key] = (ops.PreparedBatch(requests), dtypes, shapes, list(range(len(tensors))))
        pointers = [t.data_ptr() for t in tensors]
    return known[0].queue(known[3], pointers)


def grouped_allreduce_async_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> int:
    op = _resolve_op(op, average)
    return _grouped_allreduce(tensors, op, name, prescale_factor, postscale_factor, process_set, True)


def _grouped_allreduce_each_(tensors, name, op, prescale_factor, postscale_factor, process_set) -> int:
    """An in-place grouped allreduce as one core operation per member."""
    handles = _queue_prepared_group(tensors, name, op, prescale_factor, postscale_factor, process_set)
    if handles is not None:
        return _handles.add(handles, lambda: tensors, keep_alive=tensors, reads_handles=False)
    works = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    handles = ops.submit_many(
        [
            _allreduce_request(w, w, n, op, prescale_factor, postscale_factor, process_set)
            for w, n in zip(works, _group_names(name, len(works)))
        ]
    )
    copies = [(t, w) for t, w in zip(tensors, works) if w is not t]

    def finish():
        for t, w in copies:
            t.copy_(w)
        return tensors

    return _handles.add(handles, finish, keep_alive=works, reads_handles=False)


def grouped_allreduce_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    return synchronize(
        grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    )


# --------------------------------------------------------------------------- core-owned results


def _owned_result(handle: int, like: torch.Tensor) -> torch.Tensor:
    """The core's result as a new tensor of like's dtype and device (CUDA results are copied device to device)."""
    shape = ops.output_shape(handle)
    out = torch.empty(shape, dtype=like.dtype, device=like.device)
    if not like.is_cpu:
        # The copy is synchronous (cudaMemcpy), outside the current stream's order: memory the caching allocator
        # just handed out may still be read by that stream's queued work, so let the stream finish first.
        torch.cuda.current_stream(like.device).synchronize()
    ops.copy_output(handle, out.data_ptr(), out.numel() * out.element_size())
    return out


def _allgather_request(tensor, name, process_set) -> tuple:
    """(ops.request()'s tuple, the contiguous source it reads) for an allgather; a 0-d tensor gathers as one row."""
    source = _contiguous(tensor if tensor.dim() > 0 else tensor.reshape(1))
    device, stream = _placement(source, name)
    code, set_id = _dtype_code(source, name), _process_set_id(process_set)
    key = ops.request(
        OP_ALLGATHER,
        name,
        code,
        source.shape,
        source.data_ptr(),
        0,
        process_set_id=set_id,
        device=device,
        stream=stream,
    )
    return key, source


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    key, source = _allgather_request(tensor, name, process_set)
    h = ops.submit(key)
    return _handles.add([h], lambda: _owned_result(h, source), keep_alive=source)


class SparseAllreduceHandle:
    """What sparse_allreduce_async returns. Calling it (Horovod's optimizer does `handle()`) or passing it to
    synchronize() waits and returns the reduced sparse tensor (the same one on later calls); poll() works too.
    Horovod's own synchronize() returns None for this handle; hvdlite's returns the result."""

    def __init__(self, indices_handle: int, values_handle: int, like: torch.Tensor, op, process_set):
        self._indices, self._values = indices_handle, values_handle
        self._like, self._op, self._process_set = like, op, process_set
        self._result = None

    def poll(self) -> bool:
        return self._result is not None or (poll(self._indices) and poll(self._values))

    def __call__(self) -> torch.Tensor:
        if self._result is None:
            try:
                values = synchronize(self._values)
            finally:
                indices = synchronize(self._indices)
            if self._op == Average:
                values = values / self._process_set.size()
            like = self._like
            # Rows from different ranks may repeat an index: left uncoalesced, as in Horovod.
            self._result = torch.sparse_coo_tensor(
                indices.t(), values, like.shape, dtype=values.dtype, check_invariants=False
            )
            self._like = None
        return self._result


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set) -> SparseAllreduceHandle:
    """Reduces a sparse COO tensor over the set by allgathering its indices and values (every rank's entries,
    duplicates summed when the result is coalesced); values are divided by the set size for op=Average.
    Returns a handle: call it, or pass it to synchronize(), for the result."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise ValueError(
            f"sparse_allreduce_async takes a sparse COO tensor ({_describe(name)} is "
            f"{getattr(tensor, 'layout', type(tensor))}); use allreduce for dense tensors"
        )
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async supports op=Average or op=Sum, not {op!r}")
    # allgather concatenates along dimension 0: one row per entry, so indices travel transposed.
    indices = allgather_async(
        tensor._indices().t().contiguous(), name=None if name is None else f"{name}.indices", process_set=process_set
    )
    values = allgather_async(
        tensor._values().contiguous(), name=None if name is None else f"{name}.values", process_set=process_set
    )
    return SparseAllreduceHandle(indices, values, tensor, op, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    calls = [_allgather_request(t, n, process_set) for t, n in zip(tensors, _group_names(name, len(tensors)))]
    handles = ops.submit_many([c for c, _ in calls])
    pairs = list(zip(handles, [s for _, s in calls]))
    return _handles.add(handles, lambda: [_owned_result(h, s) for h, s in pairs], keep_alive=[s for _, s in pairs])


def _reducescatter_request(tensor, name, op, prescale_factor, postscale_factor, process_set) -> tuple:
    """(ops.request()'s tuple, the contiguous source it reads) for a reducescatter."""
    source = _contiguous(tensor)
    device, stream = _placement(source, name)
    key = ops.request(
        OP_REDUCESCATTER,
        name,
        _dtype_code(source, name),
        source.shape,
        source.data_ptr(),
        0,
        reduce_op=ops.core_reduce_op(op),
        prescale=prescale_factor,
        postscale=postscale_factor,
        process_set_id=_process_set_id(process_set),
        device=device,
        stream=stream,
    )
    return key, source


def reducescatter_async(
    tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0
) -> int:
    key, source = _reducescatter_request(tensor, name, op, prescale_factor, postscale_factor, process_set)
    h = ops.submit(key)
    return _handles.add([h], lambda: _owned_result(h, source), keep_alive=source)


def grouped_reducescatter_async(
    tensors, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0
) -> int:
    calls = [
        _reducescatter_request(t, n, op, prescale_factor, postscale_factor, process_set)
        for t, n in zip(tensors, _group_names(name, len(tensors)))
    ]
    handles = ops.submit_many([c for c, _ in calls])
    pairs = list(zip(handles, [s for _, s in calls]))
    return _handles.add(handles, lambda: [_owned_result(h, s) for h, s in pairs], keep_alive=[s for _, s in pairs])


def _split_counts(splits, name) -> List[int]:
    """alltoall's splits as Python ints; a float or other non-integer dtype is refused as Horovod refuses it,
    rather than silently truncated."""
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise InvalidArgumentError(
                f"alltoall of {_describe(name)}: splits must be an integer tensor "
                f"(torch.int32 as in Horovod), got {splits.dtype}"
            )
        return [int(s) for s in splits.reshape(-1).tolist()]
    counts = list(splits)
    bad = [s for s in counts if isinstance(s, bool) or not isinstance(s, numbers.Integral)]
    if bad:
        raise InvalidArgumentError(
            f"alltoall of {_describe(name)}: splits must be integers, got {type(bad[0]).__name__} {bad[0]!r}"
        )
    return [int(s) for s in counts]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """synchronize() on the handle returns (output, received_splits) whether or not splits were given, as in
    Horovod; received_splits has splits' dtype when splits is a tensor, else int32."""
    source = _contiguous(tensor if tensor.dim() > 0 else tensor.reshape(1))
    code = _dtype_code(source, name)
    splits_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    if splits is not None:
        splits = _split_counts(splits, name)
    device, stream = _placement(source, name)
    h = ops.submit(
        ops.request(
            OP_ALLTOALL,
            name,
            code,
            source.shape,
            source.data_ptr(),
            0,
            process_set_id=_process_set_id(process_set),
            splits=splits,
            device=device,
            stream=stream,
        )
    )

    def finish():
        return _owned_result(h, source), torch.tensor(ops.int_results(h), dtype=splits_dtype)

    return _handles.add([h], finish, keep_alive=source)


# --------------------------------------------------------------------------- broadcast


def _broadcast_request(tensor, output, root_rank, name, process_set) -> tuple:
    device, stream = _placement(tensor, name)
    return ops.request(
        OP_BROADCAST,
        name,
        _dtype_code(tensor, name),
        tensor.shape,
        tensor.data_ptr(),
        output.data_ptr(),
        root_rank=int(root_rank),
        process_set_id=_process_set_id(process_set),
        device=device,
        stream=stream,
    )


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    source = _contiguous(tensor)
    output = torch.empty_like(source)
    h = ops.submit(_broadcast_request(source, output, root_rank, name, process_set))
    return _handles.add_result(h, output, keep_alive=source)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    h = ops.submit(_broadcast_request(work, work, root_rank, name, process_set))
    if work is tensor:
        return _handles.add_result(h, tensor)

    def finish():
        if work is not tensor:
            tensor.copy_(work)
        return tensor

    return _handles.add([h], finish, keep_alive=work)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    if _is_compiling():  # traced by torch.compile: one graph node (compiled_ops.py)
        return compiled_ops.broadcast_(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --------------------------------------------------------------------------- synchronisation


def barrier(process_set=global_process_set) -> None:
    """Returns once every rank of the set has called barrier."""
    h = ops.submit(ops.request(OP_BARRIER, None, 0, (), 0, 0, process_set_id=_process_set_id(process_set)))
    synchronize(_handles.add([h], lambda: None))


def join(device=-1) -> int:
    """Declares that this rank has no more data. Until every rank has joined, this rank takes part in other
    ranks' allreduces with zeros (allgathers with no rows). Returns the last rank to join."""
    h = ops.submit(ops.request(OP_JOIN, None, 0, (), 0, 0))
    return synchronize(_handles.add([h], lambda: ops.int_results(h)[0]))
