"""Differentiable collectives: the synchronous hvdlite.torch ops route through these Functions when their input
requires grad, so a model can put a collective inside its forward pass (e.g. SyncBatchNorm).

Gradients: allreduce -> allreduce of the gradient with the same op; allgather -> this rank's rows of the summed
gradient; broadcast -> summed gradient at the root, zero elsewhere; alltoall -> alltoall of the gradient back
along the received splits; reducescatter -> allgather of the gradient (scaled like the forward).
"""
import torch

from hvdlite.common.ops import Average, Sum
from hvdlite.torch import mpi_ops


def _scale_for(op, process_set):
    return 1.0 / process_set.size() if op == Average else 1.0


class AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale, postscale, process_set
        return mpi_ops.synchronize(mpi_ops.allreduce_async(tensor, name=name, op=op, prescale_factor=prescale,
                                                           postscale_factor=postscale, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = mpi_ops.synchronize(mpi_ops.allreduce_async(
            grad.contiguous(), op=ctx.op, prescale_factor=ctx.prescale, postscale_factor=ctx.postscale,
            process_set=ctx.process_set))
        return reduced, None, None, None, None, None


class AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.process_set = process_set
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.scalar = tensor.dim() == 0
        return mpi_ops.synchronize(mpi_ops.allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        rows = mpi_ops.allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ctx.process_set)
        summed = mpi_ops.synchronize(mpi_ops.allreduce_async(grad.contiguous(), op=Sum,
                                                             process_set=ctx.process_set))
        me = ctx.process_set.rank()
        offset = int(rows[:me].sum())
        mine = summed[offset:offset + ctx.rows]
        return (mine.reshape(()) if ctx.scalar else mine), None, None


class BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return mpi_ops.synchronize(mpi_ops.broadcast_async(tensor, root_rank, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        summed = mpi_ops.synchronize(mpi_ops.allreduce_async(grad.contiguous(), op=Sum, process_set=ctx.process_set))
        from hvdlite.common.basics import rank

        if rank() != ctx.root_rank:
            summed = torch.zeros_like(summed)
        return summed, None, None, None


class AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = mpi_ops.synchronize(mpi_ops.alltoall_async(tensor, splits, name=name,
                                                                      process_set=process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _unused):
        back, _ = mpi_ops.synchronize(mpi_ops.alltoall_async(grad.contiguous(), ctx.received,
                                                             process_set=ctx.process_set))
        return back, None, None, None


class ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.scale = _scale_for(op, process_set) * prescale * postscale
        ctx.process_set = process_set
        return mpi_ops.synchronize(mpi_ops.reducescatter_async(tensor, name=name, op=op, process_set=process_set,
                                                               prescale_factor=prescale,
                                                               postscale_factor=postscale))

    @staticmethod
    def backward(ctx, grad):
        gathered = mpi_ops.synchronize(mpi_ops.allgather_async(grad.contiguous(), process_set=ctx.process_set))
        return gathered * ctx.scale, None, None, None, None, None
