"""PyTorch collectives with horovod.torch's names and semantics.

Every collective exists as `op` (returns a new tensor), `op_async` (returns a handle for `synchronize`/`poll`)
and, where Horovod has them, in-place `op_` / `op_async_`. The synchronous ops are defined here and are
differentiable when an input requires grad (gradients as Horovod defines them, which differ from
torch.distributed.nn's: see autograd.py); the asynchronous and in-place ones come from core_ops.py, the layer
below autograd, and are re-exported so that this module holds Horovod's whole `mpi_ops` namespace.
"""

from typing import List

import torch

from hvdlite.common import ops
from hvdlite.common.basics import global_process_set
from hvdlite.common.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - public constants
from hvdlite.torch import compiled_ops
from hvdlite.torch.autograd import (
    AllgatherFunction,
    AllreduceFunction,
    AlltoallFunction,
    BroadcastFunction,
    GroupedAllgatherFunction,
    GroupedAllreduceFunction,
    GroupedReducescatterFunction,
    ReducescatterFunction,
)
from hvdlite.torch.compression import Compression
from hvdlite.torch.core_ops import (
    SparseAllreduceHandle,
    _allreduce_sync,
    _compressor,
    _differentiable,
    _is_compiling,
    _prepared_for_name,
    _prepared_unnamed,
    _resolve_op,
    _run_at,
    _run_interrupted,
    _run_unfinished,
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)  # noqa: F401 - re-exported


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Reduces tensor over every rank of process_set and returns the result (default op: Average).
    Differentiable when tensor requires grad: the gradient is allreduced with the same op."""
    if average is None and compression is Compression.none and not _is_compiling():
        # A metric's steady state. Named: the request allreduce_ prepares for the name, run into a new output.
        if isinstance(tensor, torch.Tensor) and not (tensor.requires_grad and torch.is_grad_enabled()):
            if name is None:
                known = _prepared_unnamed(tensor, op, prescale_factor, postscale_factor, process_set)
            else:
                known = _prepared_for_name(tensor, name, op, prescale_factor, postscale_factor, process_set)
            if known is not None:  # (a contiguous tensor's empty_like is contiguous: preserve_format costs less)
                output = torch.empty_like(tensor)
                # ops.run_prepared written out, as in allreduce_: on this path a helper's frame is a visible share of
                # the call. The output is new, so the request runs at these addresses, not those it was prepared with.
                try:
                    live = _run_at(known[0], tensor.data_ptr(), output.data_ptr())
                except BaseException:
                    _run_interrupted((tensor, output))
                    raise
                if live != 0:
                    _run_unfinished(live, (tensor, output))
                return output
    op = _resolve_op(op, average)
    compression = _compressor(compression)
    wire, ctx = compression.compress(tensor)
    if _is_compiling():  # traced by torch.compile: one graph node (compiled_ops.py), differentiable
        reduced = compiled_ops.allreduce(wire, name, op, prescale_factor, postscale_factor, process_set)
    elif _differentiable(wire):
        reduced = AllreduceFunction.apply(wire, name, op, prescale_factor, postscale_factor, process_set)
    else:
        reduced = _allreduce_sync(wire, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


# Where the fast calls were built, the public allreduce is their C function, which takes a metric's steady state
# (as the first branch above) and hands every other call to the Python function; torch.compile traces a Python
# stand-in for it (compiled_ops.py).
if ops.fast_calls is not None:
    _allreduce_reference = allreduce

    def _allreduce_in_graph(
        tensor,
        average=None,
        name=None,
        compression=None,
        op=None,
        prescale_factor=1.0,
        postscale_factor=1.0,
        process_set=None,
    ):
        # Its defaults are plain values: the tracer cannot take a compressor or a process set from them.
        compression = Compression.none if compression is None else compression
        process_set = global_process_set if process_set is None else process_set
        return _allreduce_reference(
            tensor, average, name, compression, op, prescale_factor, postscale_factor, process_set
        )

    ops.fast_calls.setup_allreduce(allreduce, Compression.none, torch.empty_like, torch.is_grad_enabled)
    allreduce = ops.fast_public(ops.fast_calls.allreduce, allreduce, __name__)
    compiled_ops.trace_in_place_of("allreduce", ops.fast_calls.allreduce, _allreduce_in_graph)


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> List[torch.Tensor]:
    """allreduce of every tensor of the list, negotiated and reduced together. Differentiable (one autograd
    node for the group) when any of them requires grad."""
    op = _resolve_op(op, average)
    compression = _compressor(compression)
    wires, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    if _is_compiling() and wires and not _differentiable(*wires):
        reduced = compiled_ops.grouped_allreduce(wires, name, op, prescale_factor, postscale_factor, process_set)
    elif _differentiable(*wires):
        reduced = GroupedAllreduceFunction.apply(name, op, prescale_factor, postscale_factor, process_set, *wires)
    else:
        reduced = synchronize(
            grouped_allreduce_async(list(wires), None, name, op, prescale_factor, postscale_factor, process_set)
        )
    return [compression.decompress(r, ctx) for r, ctx in zip(reduced, ctxs)]


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Concatenates every rank's tensor along dimension 0 (first dimensions may differ). Differentiable: the
    gradient is averaged over the set, then this rank's rows are taken (Horovod's rule)."""
    if _is_compiling() and not _differentiable(tensor):
        return compiled_ops.allgather(tensor, name, process_set)
    if _differentiable(tensor):
        return AllgatherFunction.apply(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> List[torch.Tensor]:
    """allgather of every tensor of the list, together. Differentiable (one autograd node for the group)."""
    if _differentiable(*tensors):
        return list(GroupedAllgatherFunction.apply(name, process_set, *tensors))
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def reducescatter(
    tensor,
    name=None,
    compression=Compression.none,
    op=Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> torch.Tensor:
    """Reduces tensor over the ranks and returns this rank's slice of dimension 0 (earlier ranks get the
    extra rows when it does not divide evenly). Differentiable: the gradient is allgathered (times the set size
    for op=Sum, times prescale * postscale), Horovod's rule."""
    compression = _compressor(compression)
    wire, ctx = compression.compress(tensor)
    if _differentiable(wire):
        reduced = ReducescatterFunction.apply(wire, name, op, prescale_factor, postscale_factor, process_set)
    else:
        reduced = synchronize(reducescatter_async(wire, name, op, process_set, prescale_factor, postscale_factor))
    return compression.decompress(reduced, ctx)


def grouped_reducescatter(
    tensors,
    name=None,
    compression=Compression.none,
    op=Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> List[torch.Tensor]:
    """reducescatter of every tensor of the list, together. Differentiable (one autograd node for the group)."""
    compression = _compressor(compression)
    wires, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    if _differentiable(*wires):
        reduced = GroupedReducescatterFunction.apply(name, op, prescale_factor, postscale_factor, process_set, *wires)
    else:
        reduced = synchronize(
            grouped_reducescatter_async(list(wires), name, op, process_set, prescale_factor, postscale_factor)
        )
    return [compression.decompress(r, ctx) for r, ctx in zip(reduced, ctxs)]


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows of tensor to rank i of the set and returns the received rows concatenated in rank
    order; with splits given, returns (that tensor, received splits), as Horovod does. Without splits,
    dimension 0 is divided evenly. Differentiable: the gradient goes back along the received splits."""
    if _differentiable(tensor):
        output, received = AlltoallFunction.apply(tensor, splits, name, process_set)
    else:
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return output if splits is None else (output, received)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Returns root_rank's tensor on every rank of the set (root_rank is a global rank). Differentiable: the
    gradient is averaged over the set on the root and zero elsewhere (Horovod's rule)."""
    if _is_compiling():
        return compiled_ops.broadcast(tensor, root_rank, name, process_set)
    if _differentiable(tensor):
        return BroadcastFunction.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))
