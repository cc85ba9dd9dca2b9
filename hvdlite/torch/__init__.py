"""hvdlite for PyTorch: `import hvdlite.torch as hvd` in place of `import horovod.torch as hvd`."""
from hvdlite.common.basics import (ProcessSet, add_process_set, build_info, cross_rank, cross_size,  # noqa: F401
                                   global_process_set, init, is_homogeneous, is_initialized, local_rank,
                                   local_size, rank, remove_process_set, shutdown, size)
from hvdlite.common.errors import (AbortedError, HorovodInternalError, HvdliteError, HvdliteTimeoutError,  # noqa: F401
                                   InvalidArgumentError, MismatchError, NotInitializedError, PeerError)
from hvdlite.torch.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,  # noqa: F401
                                   allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
                                   alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                                   broadcast_async_, grouped_allgather, grouped_allgather_async,
                                   grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                                   grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async,
                                   join, poll, reducescatter, reducescatter_async, synchronize)
