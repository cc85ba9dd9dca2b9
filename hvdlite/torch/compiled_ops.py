"""The collectives as PyTorch custom operators, for code that torch.compile traces.

torch.compile cannot trace into hvdlite (the core is reached through cffi, with locks and handle tables on the
way): it would end the graph before each collective and start another after it. Inside a traced function the
public collectives (allreduce, allreduce_, broadcast, broadcast_, allgather, grouped_allreduce) call these
operators instead, which the graph records as single nodes: their fake implementations give the output's shape
and dtype without running anything, and at run time they run the same eager code as outside torch.compile.
allreduce and broadcast are differentiable with the same gradients as in eager mode (autograd.py).

An operator takes plain arguments: a process set is passed by id and found again in the sets seen while
tracing; a name of "" means unnamed (the core numbers unnamed collectives in the order each rank issues them,
which every rank's compiled graph keeps).
"""

import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Dict, List

import torch

from hvdlite.common.basics import rank
from hvdlite.common.ops import Average
from hvdlite.torch import core_ops

_sets: Dict[int, object] = {0: core_ops.global_process_set}


def _set_id(process_set) -> int:
    set_id = core_ops._process_set_id(process_set)
    _sets[set_id] = process_set
    return set_id


def _name(name: str):
    return name or None


@torch.library.custom_op("hvdlite::allreduce", mutates_args=())
def _allreduce(
    tensor: torch.Tensor, name: str, op: int, prescale: float, postscale: float, process_set_id: int
) -> torch.Tensor:
    return core_ops._allreduce_sync(tensor, _name(name), op, prescale, postscale, _sets[process_set_id])


@_allreduce.register_fake
def _allreduce_fake(tensor, name, op, prescale, postscale, process_set_id):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


def _allreduce_setup(ctx, inputs, output):
    ctx.op, ctx.prescale, ctx.postscale, ctx.process_set_id = inputs[2:]


def _allreduce_backward(ctx, grad):
    reduced = _allreduce(grad.contiguous(), "", ctx.op, ctx.prescale, ctx.postscale, ctx.process_set_id)
    return reduced, None, None, None, None, None


_allreduce.register_autograd(_allreduce_backward, setup_context=_allreduce_setup)


@torch.library.custom_op("hvdlite::allreduce_", mutates_args=("tensor",))
def _allreduce_inplace(
    tensor: torch.Tensor, name: str, op: int, prescale: float, postscale: float, process_set_id: int
) -> None:
    core_ops.allreduce_(tensor, None, _name(name), op, prescale, postscale, _sets[process_set_id])


@_allreduce_inplace.register_fake
def _allreduce_inplace_fake(tensor, name, op, prescale, postscale, process_set_id):
    return None


@torch.library.custom_op("hvdlite::grouped_allreduce", mutates_args=())
def _grouped_allreduce(
    tensors: List[torch.Tensor], name: str, op: int, prescale: float, postscale: float, process_set_id: int
) -> List[torch.Tensor]:
    handle = core_ops.grouped_allreduce_async(
        tensors, None, _name(name), op, prescale, postscale, _sets[process_set_id]
    )
    return core_ops.synchronize(handle)


@_grouped_allreduce.register_fake
def _grouped_allreduce_fake(tensors, name, op, prescale, postscale, process_set_id):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]


@torch.library.custom_op("hvdlite::broadcast", mutates_args=())
def _broadcast(tensor: torch.Tensor, root_rank: int, name: str, process_set_id: int) -> torch.Tensor:
    return core_ops.synchronize(core_ops.broadcast_async(tensor, root_rank, _name(name), _sets[process_set_id]))


@_broadcast.register_fake
def _broadcast_fake(tensor, root_rank, name, process_set_id):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


def _broadcast_setup(ctx, inputs, output):
    ctx.root_rank, ctx.process_set_id = inputs[1], inputs[3]


def _broadcast_backward(ctx, grad):
    # As in eager mode (autograd.py): averaged over the set on the root, zero elsewhere.
    averaged = _allreduce(grad.contiguous(), "", Average, 1.0, 1.0, ctx.process_set_id)
    return (averaged if rank() == ctx.root_rank else torch.zeros_like(averaged)), None, None, None


_broadcast.register_autograd(_broadcast_backward, setup_context=_broadcast_setup)


@torch.library.custom_op("hvdlite::broadcast_", mutates_args=("tensor",))
def _broadcast_inplace(tensor: torch.Tensor, root_rank: int, name: str, process_set_id: int) -> None:
    core_ops.broadcast_(tensor, root_rank, _name(name), _sets[process_set_id])


@_broadcast_inplace.register_fake
def _broadcast_inplace_fake(tensor, root_rank, name, process_set_id):
    return None


@torch.library.custom_op("hvdlite::allgather", mutates_args=())
def _allgather(tensor: torch.Tensor, name: str, process_set_id: int) -> torch.Tensor:
    return core_ops.synchronize(core_ops.allgather_async(tensor, _name(name), _sets[process_set_id]))


@_allgather.register_fake
def _allgather_fake(tensor, name, process_set_id):
    # The rows come from every rank: how many is known only when it runs.
    rows = torch.library.get_ctx().new_dynamic_size()
    return tensor.new_empty((rows, *tensor.shape[1:]) if tensor.dim() else (rows,))


# What the public collectives call while torch.compile traces them.


def allreduce(tensor, name, op, prescale_factor, postscale_factor, process_set):
    return _allreduce(tensor, name or "", op, prescale_factor, postscale_factor, _set_id(process_set))


def allreduce_(tensor, name, op, prescale_factor, postscale_factor, process_set):
    _allreduce_inplace(tensor, name or "", op, prescale_factor, postscale_factor, _set_id(process_set))
    return tensor


def grouped_allreduce(tensors, name, op, prescale_factor, postscale_factor, process_set):
    return _grouped_allreduce(list(tensors), name or "", op, prescale_factor, postscale_factor, _set_id(process_set))


def broadcast(tensor, root_rank, name, process_set):
    return _broadcast(tensor, int(root_rank), name or "", _set_id(process_set))


def broadcast_(tensor, root_rank, name, process_set):
    _broadcast_inplace(tensor, int(root_rank), name or "", _set_id(process_set))
    return tensor


def allgather(tensor, name, process_set):
    return _allgather(tensor, name or "", _set_id(process_set))


core_ops.compiled_ops = sys.modules[__name__]  # for core_ops' in-place collectives, without an import cycle


# hvdlite.torch.allreduce_ where it is a C function (hvdlite._fast_calls), which torch.compile cannot trace: it
# traces this in its place. Its defaults are plain values: the tracer cannot take a process set from them.
def _allreduce_in_graph(
    tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None
):
    op = core_ops._resolve_op(op, average)
    process_set = core_ops.global_process_set if process_set is None else process_set
    return allreduce_(tensor, name, op, prescale_factor, postscale_factor, process_set)


_C_FUNCTION = getattr(core_ops.allreduce_, "func", None)
# The C functions that torch.compile traces a Python stand-in for: {public name: (C function, stand-in)}.
_stand_ins = {}


def trace_in_place_of(public, c_function, stand_in):
    """Has torch.compile trace stand_in where it meets c_function (hvdlite.torch.<public>): at once where
    torch._dynamo has been imported, else when it is."""
    _stand_ins[public] = (c_function, stand_in)
    if "torch._dynamo" in sys.modules:
        _substitute(public)
    elif not any(isinstance(finder, _AfterDynamoImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamoImport())


def _substitute(public):
    c_function, stand_in = _stand_ins[public]
    try:
        torch.compiler.substitute_in_graph(c_function, skip_signature_check=True)(stand_in)
    except Exception as error:  # a torch whose tracing hooks changed: compiled code calls the C function eagerly
        warnings.warn(f"hvdlite: torch.compile will not trace hvdlite.torch.{public} into its graph: {error}")


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Registers the stand-ins once torch._dynamo has been imported (torch.compile imports it). Importing it here
    would cost every import of hvdlite.torch about a second, for programs that never compile."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def load_then_register(module):
            load(module)
            for public in list(_stand_ins):
                _substitute(public)

        spec.loader.exec_module = load_then_register
        return spec


if _C_FUNCTION is not None:
    trace_in_place_of("allreduce_", _C_FUNCTION, _allreduce_in_graph)
