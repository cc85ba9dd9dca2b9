"""What DistributedOptimizer holds for each gradient between backward and the end of synchronize(): one state per
kind of exchange, each of which knows how to finish it.

DEFERRED: ready, to be submitted by synchronize() in the order backward produced it.
BATCHED: queued in the gradient buckets (gradient_buckets.py), whose wait() finishes it in place.
DenseReduction, SparseReduction: an allreduce of the (compressed) dense gradient, or an allgather of a sparse one's
indices and values, in flight. FailedSubmission: the submission raised; synchronize() raises it once every other
gradient is done.
"""

from hvdlite.torch import mpi_ops


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return self.name


DEFERRED = _Marker("DEFERRED")
BATCHED = _Marker("BATCHED")


class DenseReduction:
    __slots__ = ("handle", "wire", "ctx")

    def __init__(self, handle, wire, ctx):
        self.handle, self.wire, self.ctx = handle, wire, ctx  # wire: the tensor sent, kept alive until done

    def finish(self, p, compression) -> None:
        result = mpi_ops.synchronize(self.handle)
        if result is p.grad:
            return
        reduced = compression.decompress(result, self.ctx)
        if p.grad.is_sparse:  # sparse_as_dense: the optimizer still gets a sparse gradient, as in Horovod
            p.grad = reduced.to_sparse(p.grad.sparse_dim())
        else:
            p.grad.copy_(reduced)


class SparseReduction:
    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    def finish(self, p, compression) -> None:
        p.grad = mpi_ops.synchronize(self.handle).coalesce()


class FailedSubmission:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error

    def finish(self, p, compression) -> None:
        raise self.error
