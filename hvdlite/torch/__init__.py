"""hvdlite for PyTorch: `import hvdlite.torch as hvd` in place of `import horovod.torch as hvd`."""

from hvdlite.common.basics import (
    ProcessSet,
    add_process_set,
    build_info,
    cross_rank,
    cross_size,  # noqa: F401
    global_process_set,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
    timeline_counter,
)
from hvdlite.common.build_queries import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,  # noqa: F401
    gpu_available,  # noqa: F401
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from hvdlite.common.errors import (
    AbortedError,
    HorovodInternalError,
    HvdliteError,
    HvdliteTimeoutError,  # noqa: F401
    InvalidArgumentError,
    MismatchError,
    NotInitializedError,
    PeerError,
)
from hvdlite.torch import elastic  # noqa: F401,E402 - hvd.elastic.run, TorchState, ElasticSampler
from hvdlite.torch.compression import Compression  # noqa: F401
from hvdlite.torch.compute_threads import init  # hvd.init: also shares the host's CPUs among its ranks
from hvdlite.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,  # noqa: F401
    broadcast_parameters,
)
from hvdlite.torch.mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,  # noqa: F401
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from hvdlite.torch.optimizer import DistributedOptimizer  # noqa: F401
from hvdlite.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
