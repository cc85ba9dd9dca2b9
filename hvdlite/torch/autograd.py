"""Differentiable collectives: the synchronous hvdlite.torch ops (and their grouped forms, one Function over the
whole group) route through these Functions when an input requires grad, so a model can put a collective inside
its forward pass (e.g. SyncBatchNorm).

The gradients are horovod.torch's, which treat the job's loss as the *average* of the ranks' losses where
torch.distributed.nn treats it as their *sum*:

- allreduce: the gradient is allreduced with the forward's op and scale factors (Average -> averaged).
- allgather: the gradient is **averaged** over the set, then this rank's rows are taken
  (torch.distributed.nn.functional.all_gather sums them).
- broadcast: the gradient is **averaged** over the set on the root, zero elsewhere (torch.distributed.nn sums
  it onto the root).
- alltoall: the gradient goes back along the received splits (no scaling, as in torch.distributed.nn).
- reducescatter: the gradient is allgathered, times the set size for op=Sum and times prescale * postscale
  (torch.distributed.nn's reduce_scatter gradient is the plain allgather).

Every rank must run the backward pass of a differentiable collective, as it runs the forward.
"""

from typing import Sequence

import torch

from hvdlite.common.basics import rank
from hvdlite.common.ops import Average, Sum
from hvdlite.torch import core_ops


def _rows(tensor: torch.Tensor) -> int:
    return tensor.shape[0] if tensor.dim() > 0 else 1


def _my_rows(gradients: Sequence[torch.Tensor], my_rows: Sequence[int], scalar: Sequence[bool], process_set):
    """Slices this rank's rows out of gathered gradients: one allgather of every member's row counts
    (one column per tensor) gives the offsets."""
    counts = core_ops.synchronize(
        core_ops.allgather_async(torch.tensor([list(my_rows)], dtype=torch.int64), process_set=process_set)
    )
    me = process_set.rank()
    offsets = counts[:me].sum(dim=0).tolist()
    out = []
    for grad, offset, rows, is_scalar in zip(gradients, offsets, my_rows, scalar):
        mine = grad[offset : offset + rows]
        out.append(mine.reshape(()) if is_scalar else mine)
    return out


def _reducescatter_gradient_scale(op, prescale, postscale, process_set) -> float:
    return (process_set.size() if op == Sum else 1) * prescale * postscale


class AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale, postscale, process_set
        return core_ops.synchronize(
            core_ops.allreduce_async(
                tensor,
                name=name,
                op=op,
                prescale_factor=prescale,
                postscale_factor=postscale,
                process_set=process_set,
            )
        )

    @staticmethod
    def backward(ctx, grad):
        reduced = core_ops.synchronize(
            core_ops.allreduce_async(
                grad.contiguous(),
                op=ctx.op,
                prescale_factor=ctx.prescale,
                postscale_factor=ctx.postscale,
                process_set=ctx.process_set,
            )
        )
        return reduced, None, None, None, None, None


class GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale, postscale, process_set
        return tuple(
            core_ops.synchronize(
                core_ops.grouped_allreduce_async(
                    list(tensors),
                    name=name,
                    op=op,
                    prescale_factor=prescale,
                    postscale_factor=postscale,
                    process_set=process_set,
                )
            )
        )

    @staticmethod
    def backward(ctx, *grads):
        reduced = core_ops.synchronize(
            core_ops.grouped_allreduce_async(
                [g.contiguous() for g in grads],
                op=ctx.op,
                prescale_factor=ctx.prescale,
                postscale_factor=ctx.postscale,
                process_set=ctx.process_set,
            )
        )
        return (None,) * 5 + tuple(reduced)


class AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.process_set = process_set
        ctx.rows, ctx.scalar = _rows(tensor), tensor.dim() == 0
        return core_ops.synchronize(core_ops.allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        averaged = core_ops.synchronize(
            core_ops.allreduce_async(grad.contiguous(), op=Average, process_set=ctx.process_set)
        )
        return _my_rows([averaged], [ctx.rows], [ctx.scalar], ctx.process_set)[0], None, None


class GroupedAllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.process_set = process_set
        ctx.rows = [_rows(t) for t in tensors]
        ctx.scalar = [t.dim() == 0 for t in tensors]
        return tuple(
            core_ops.synchronize(core_ops.grouped_allgather_async(list(tensors), name=name, process_set=process_set))
        )

    @staticmethod
    def backward(ctx, *grads):
        averaged = core_ops.synchronize(
            core_ops.grouped_allreduce_async([g.contiguous() for g in grads], op=Average, process_set=ctx.process_set)
        )
        return (None, None) + tuple(_my_rows(averaged, ctx.rows, ctx.scalar, ctx.process_set))


class BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return core_ops.synchronize(core_ops.broadcast_async(tensor, root_rank, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        averaged = core_ops.synchronize(
            core_ops.allreduce_async(grad.contiguous(), op=Average, process_set=ctx.process_set)
        )
        if rank() != ctx.root_rank:  # root_rank is a global rank, as in the forward
            averaged = torch.zeros_like(averaged)
        return averaged, None, None, None


class AlltoallFunction(torch.autograd.Function):
    """Returns (output, received_splits); core_ops.alltoall drops received_splits when no splits were given."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = core_ops.synchronize(
            core_ops.alltoall_async(tensor, splits, name=name, process_set=process_set)
        )
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _received_splits_grad):
        back, _ = core_ops.synchronize(
            core_ops.alltoall_async(grad.contiguous(), ctx.received, process_set=ctx.process_set)
        )
        return back, None, None, None


class ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.scale = _reducescatter_gradient_scale(op, prescale, postscale, process_set)
        ctx.process_set = process_set
        return core_ops.synchronize(
            core_ops.reducescatter_async(
                tensor,
                name=name,
                op=op,
                process_set=process_set,
                prescale_factor=prescale,
                postscale_factor=postscale,
            )
        )

    @staticmethod
    def backward(ctx, grad):
        gathered = core_ops.synchronize(core_ops.allgather_async(grad.contiguous(), process_set=ctx.process_set))
        return gathered * ctx.scale, None, None, None, None, None


class GroupedReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.scale = _reducescatter_gradient_scale(op, prescale, postscale, process_set)
        ctx.process_set = process_set
        return tuple(
            core_ops.synchronize(
                core_ops.grouped_reducescatter_async(
                    list(tensors),
                    name=name,
                    op=op,
                    process_set=process_set,
                    prescale_factor=prescale,
                    postscale_factor=postscale,
                )
            )
        )

    @staticmethod
    def backward(ctx, *grads):
        gathered = core_ops.synchronize(
            core_ops.grouped_allgather_async([g.contiguous() for g in grads], process_set=ctx.process_set)
        )
        return (None,) * 5 + tuple(g * ctx.scale for g in gathered)
