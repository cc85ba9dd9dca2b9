"""PyTorch collectives with horovod.torch's names and semantics.

Every collective exists as `op` (returns a new tensor), `op_async` (returns a handle for `synchronize`/`poll`)
and, where Horovod has them, in-place `op_` / `op_async_`. Tensors are passed to the core by pointer (CPU,
contiguous); no extension is compiled against PyTorch. The synchronous ops are differentiable (gradients as
Horovod defines them, which differ from torch.distributed.nn's: see hvdlite/torch/autograd.py).
"""
import warnings
from typing import List, Optional, Sequence

import torch

from hvdlite.common import ops
from hvdlite.common.basics import (OP_ALLGATHER, OP_ALLREDUCE, OP_ALLTOALL, OP_BARRIER, OP_BROADCAST, OP_JOIN,
                                   OP_REDUCESCATTER, global_process_set)
from hvdlite.common.errors import InvalidArgumentError
from hvdlite.common.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - public constants
from hvdlite.torch.compression import Compression

_DTYPES = {torch.uint8: 0, torch.int8: 1, torch.int32: 2, torch.int64: 3, torch.float16: 4, torch.bfloat16: 5,
           torch.float32: 6, torch.float64: 7, torch.bool: 8, torch.int16: 10}
if hasattr(torch, "uint16"):  # torch >= 2.3
    _DTYPES[torch.uint16] = 9

_handles = ops.HandleTable()


def _describe(name: Optional[str]) -> str:
    return f"tensor '{name}'" if name else "an unnamed tensor"


def _dtype_code(tensor: torch.Tensor, name: Optional[str]) -> int:
    if tensor.device.type != "cpu":
        raise InvalidArgumentError(
            f"{_describe(name)} is on {tensor.device}; this hvdlite build has no GPU backend (NCCL), so "
            "collectives take CPU tensors only: move it with .cpu() first")
    try:
        return _DTYPES[tensor.dtype]
    except KeyError:
        raise InvalidArgumentError(f"{_describe(name)} has dtype {tensor.dtype}, which hvdlite does not support; "
                                   f"supported: {', '.join(str(d) for d in _DTYPES)}") from None


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _resolve_op(op, average) -> int:
    """Horovod's handling of the deprecated average argument (same messages and warning category)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


def _differentiable(*tensors) -> bool:
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


def synchronize(handle):
    """Waits for an asynchronous operation and returns its result (raises its error)."""
    if isinstance(handle, SparseAllreduceHandle):
        return handle()
    return _handles.synchronize(handle)


# --------------------------------------------------------------------------- allreduce

def _allreduce_call(tensor, output, name, op, prescale_factor, postscale_factor, process_set) -> dict:
    return dict(op=OP_ALLREDUCE, name=name, dtype=_dtype_code(tensor, name), shape=tuple(tensor.shape),
                input_ptr=tensor.data_ptr(), output_ptr=output.data_ptr(), reduce_op=ops.core_reduce_op(op),
                prescale=prescale_factor, postscale=postscale_factor, process_set_id=_process_set_id(process_set))


def _allreduce_enqueue(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    return ops.enqueue(**_allreduce_call(tensor, output, name, op, prescale_factor, postscale_factor, process_set))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    op = _resolve_op(op, average)
    source = _contiguous(tensor)
    output = torch.empty_like(source, memory_format=torch.contiguous_format)
    h = _allreduce_enqueue(source, output, name, op, prescale_factor, postscale_factor, process_set)
    return _handles.add([h], lambda: output, keep_alive=source)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Reduces tensor over every rank of process_set and returns the result (default op: Average).
    Differentiable when tensor requires grad: the gradient is allreduced with the same op."""
    op = _resolve_op(op, average)
    compression = _compressor(compression)
    wire, ctx = compression.compress(tensor)
    if _differentiable(wire):
        from hvdlite.torch.autograd import AllreduceFunction

        reduced = AllreduceFunction.apply(wire, name, op, prescale_factor, postscale_factor, process_set)
    else:
        reduced = synchronize(allreduce_async(wire, None, name, op, prescale_factor, postscale_factor, process_set))
    return compression.decompress(reduced, ctx)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    op = _resolve_op(op, average)
    if tensor.is_contiguous():
        h = _allreduce_enqueue(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)
        return _handles.add([h], lambda: tensor, keep_alive=tensor)
    work = tensor.contiguous()
    h = _allreduce_enqueue(work, work, name, op, prescale_factor, postscale_factor, process_set)
    return _handles.add([h], lambda: tensor.copy_(work), keep_alive=work)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def _group_names(name, count):
    return [None] * count if name is None else [f"{name}.{i}" for i in range(count)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    op = _resolve_op(op, average)
    sources = [_contiguous(t) for t in tensors]
    outputs = [torch.empty_like(s, memory_format=torch.contiguous_format) for s in sources]
    handles = ops.enqueue_many([_allreduce_call(s, o, n, op, prescale_factor, postscale_factor, process_set)
                                for s, o, n in zip(sources, outputs, _group_names(name, len(sources)))])
    return _handles.add(handles, lambda: outputs, keep_alive=sources)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set) -> List[torch.Tensor]:
    """allreduce of every tensor of the list, negotiated and reduced together. Differentiable (one autograd
    node for the group) when any of them requires grad."""
    op = _resolve_op(op, average)
    compression = _compressor(compression)
    wires, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    if _differentiable(*wires):
        from hvdlite.torch.autograd import GroupedAllreduceFunction

        reduced = GroupedAllreduceFunction.apply(name, op, prescale_factor, postscale_factor, process_set, *wires)
    else:
        reduced = synchronize(grouped_allreduce_async(list(wires), None, name, op, prescale_factor,
                                                      postscale_factor, process_set))
    return [compression.decompress(r, ctx) for r, ctx in zip(reduced, ctxs)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    op = _resolve_op(op, average)
    works = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    handles = ops.enqueue_many([_allreduce_call(w, w, n, op, prescale_factor, postscale_factor, process_set)
                                for w, n in zip(works, _group_names(name, len(works)))])

    def finish():
        for t, w in zip(tensors, works):
            if w is not t:
                t.copy_(w)
        return list(tensors)

    return _handles.add(handles, finish, keep_alive=works)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


# --------------------------------------------------------------------------- core-owned results

def _owned_result(handle: int, dtype: torch.dtype) -> torch.Tensor:
    shape = ops.output_shape(handle)
    out = torch.empty(shape, dtype=dtype)
    ops.copy_output(handle, out.data_ptr(), out.numel() * out.element_size())
    return out


def _allgather_call(tensor, name, process_set):
    source = _contiguous(tensor if tensor.dim() > 0 else tensor.reshape(1))
    return dict(op=OP_ALLGATHER, name=name, dtype=_dtype_code(source, name), shape=tuple(source.shape),
                input_ptr=source.data_ptr(), output_ptr=0, process_set_id=_process_set_id(process_set)), source


def _allgather_enqueue(tensor, name, process_set):
    call, source = _allgather_call(tensor, name, process_set)
    return ops.enqueue(**call), source


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    h, source = _allgather_enqueue(tensor, name, process_set)
    return _handles.add([h], lambda: _owned_result(h, source.dtype), keep_alive=source)


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Concatenates every rank's tensor along dimension 0 (first dimensions may differ). Differentiable: the
    gradient is averaged over the set, then this rank's rows are taken (Horovod's rule)."""
    if _differentiable(tensor):
        from hvdlite.torch.autograd import AllgatherFunction

        return AllgatherFunction.apply(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


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
            self._result = torch.sparse_coo_tensor(indices.t(), values, like.shape, dtype=values.dtype,
                                                   check_invariants=False)
            self._like = None
        return self._result


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set) -> SparseAllreduceHandle:
    """Reduces a sparse COO tensor over the set by allgathering its indices and values (every rank's entries,
    duplicates summed when the result is coalesced); values are divided by the set size for op=Average.
    Returns a handle: call it, or pass it to synchronize(), for the result."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise ValueError(f"sparse_allreduce_async takes a sparse COO tensor ({_describe(name)} is "
                         f"{getattr(tensor, 'layout', type(tensor))}); use allreduce for dense tensors")
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async supports op=Average or op=Sum, not {op!r}")
    # allgather concatenates along dimension 0: one row per entry, so indices travel transposed.
    indices = allgather_async(tensor._indices().t().contiguous(), name=None if name is None else f"{name}.indices",
                              process_set=process_set)
    values = allgather_async(tensor._values().contiguous(), name=None if name is None else f"{name}.values",
                             process_set=process_set)
    return SparseAllreduceHandle(indices, values, tensor, op, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    calls = [_allgather_call(t, n, process_set) for t, n in zip(tensors, _group_names(name, len(tensors)))]
    handles = ops.enqueue_many([c for c, _ in calls])
    pairs = list(zip(handles, [s for _, s in calls]))
    return _handles.add(handles, lambda: [_owned_result(h, s.dtype) for h, s in pairs],
                        keep_alive=[s for _, s in pairs])


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> List[torch.Tensor]:
    """allgather of every tensor of the list, together. Differentiable (one autograd node for the group)."""
    if _differentiable(*tensors):
        from hvdlite.torch.autograd import GroupedAllgatherFunction

        return list(GroupedAllgatherFunction.apply(name, process_set, *tensors))
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def _reducescatter_call(tensor, name, op, prescale_factor, postscale_factor, process_set):
    source = _contiguous(tensor)
    return dict(op=OP_REDUCESCATTER, name=name, dtype=_dtype_code(source, name), shape=tuple(source.shape),
                input_ptr=source.data_ptr(), output_ptr=0, reduce_op=ops.core_reduce_op(op),
                prescale=prescale_factor, postscale=postscale_factor,
                process_set_id=_process_set_id(process_set)), source


def _reducescatter_enqueue(tensor, name, op, prescale_factor, postscale_factor, process_set):
    call, source = _reducescatter_call(tensor, name, op, prescale_factor, postscale_factor, process_set)
    return ops.enqueue(**call), source


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    h, source = _reducescatter_enqueue(tensor, name, op, prescale_factor, postscale_factor, process_set)
    return _handles.add([h], lambda: _owned_result(h, source.dtype), keep_alive=source)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduces tensor over the ranks and returns this rank's slice of dimension 0 (earlier ranks get the
    extra rows when it does not divide evenly). Differentiable: the gradient is allgathered (times the set size
    for op=Sum, times prescale * postscale), Horovod's rule."""
    compression = _compressor(compression)
    wire, ctx = compression.compress(tensor)
    if _differentiable(wire):
        from hvdlite.torch.autograd import ReducescatterFunction

        reduced = ReducescatterFunction.apply(wire, name, op, prescale_factor, postscale_factor, process_set)
    else:
        reduced = synchronize(reducescatter_async(wire, name, op, process_set, prescale_factor, postscale_factor))
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    calls = [_reducescatter_call(t, n, op, prescale_factor, postscale_factor, process_set)
             for t, n in zip(tensors, _group_names(name, len(tensors)))]
    handles = ops.enqueue_many([c for c, _ in calls])
    pairs = list(zip(handles, [s for _, s in calls]))
    return _handles.add(handles, lambda: [_owned_result(h, s.dtype) for h, s in pairs],
                        keep_alive=[s for _, s in pairs])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0) -> List[torch.Tensor]:
    """reducescatter of every tensor of the list, together. Differentiable (one autograd node for the group)."""
    compression = _compressor(compression)
    wires, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    if _differentiable(*wires):
        from hvdlite.torch.autograd import GroupedReducescatterFunction

        reduced = GroupedReducescatterFunction.apply(name, op, prescale_factor, postscale_factor, process_set,
                                                     *wires)
    else:
        reduced = synchronize(grouped_reducescatter_async(list(wires), name, op, process_set, prescale_factor,
                                                          postscale_factor))
    return [compression.decompress(r, ctx) for r, ctx in zip(reduced, ctxs)]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """synchronize() on the handle returns (output, received_splits) whether or not splits were given, as in
    Horovod; received_splits has splits' dtype when splits is a tensor, else int32."""
    source = _contiguous(tensor if tensor.dim() > 0 else tensor.reshape(1))
    code = _dtype_code(source, name)
    splits_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    if splits is not None:
        splits = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    h = ops.enqueue(OP_ALLTOALL, name, code, tuple(source.shape), source.data_ptr(), 0,
                    process_set_id=_process_set_id(process_set), splits=splits)

    def finish():
        return _owned_result(h, source.dtype), torch.tensor(ops.int_results(h), dtype=splits_dtype)

    return _handles.add([h], finish, keep_alive=source)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows of tensor to rank i of the set and returns the received rows concatenated in rank
    order; with splits given, returns (that tensor, received splits), as Horovod does. Without splits,
    dimension 0 is divided evenly. Differentiable: the gradient goes back along the received splits."""
    if _differentiable(tensor):
        from hvdlite.torch.autograd import AlltoallFunction

        output, received = AlltoallFunction.apply(tensor, splits, name, process_set)
    else:
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return output if splits is None else (output, received)


# --------------------------------------------------------------------------- broadcast

def _broadcast_enqueue(tensor, output, root_rank, name, process_set):
    code = _dtype_code(tensor, name)
    return ops.enqueue(OP_BROADCAST, name, code, tuple(tensor.shape), tensor.data_ptr(), output.data_ptr(),
                       root_rank=int(root_rank), process_set_id=_process_set_id(process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    source = _contiguous(tensor)
    output = torch.empty_like(source, memory_format=torch.contiguous_format)
    h = _broadcast_enqueue(source, output, root_rank, name, process_set)
    return _handles.add([h], lambda: output, keep_alive=source)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Returns root_rank's tensor on every rank of the set (root_rank is a global rank). Differentiable: the
    gradient is averaged over the set on the root and zero elsewhere (Horovod's rule)."""
    if _differentiable(tensor):
        from hvdlite.torch.autograd import BroadcastFunction

        return BroadcastFunction.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    h = _broadcast_enqueue(work, work, root_rank, name, process_set)

    def finish():
        if work is not tensor:
            tensor.copy_(work)
        return tensor

    return _handles.add([h], finish, keep_alive=work)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --------------------------------------------------------------------------- synchronisation

def barrier(process_set=global_process_set) -> None:
    """Returns once every rank of the set has called barrier."""
    h = ops.enqueue(OP_BARRIER, None, 0, (), 0, 0, process_set_id=_process_set_id(process_set))
    synchronize(_handles.add([h], lambda: None))


def join(device=-1) -> int:
    """Declares that this rank has no more data. Until every rank has joined, this rank takes part in other
    ranks' allreduces with zeros (allgathers with no rows). Returns the last rank to join."""
    h = ops.enqueue(OP_JOIN, None, 0, (), 0, 0)
    return synchronize(_handles.add([h], lambda: ops.int_results(h)[0]))
