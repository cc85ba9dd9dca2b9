"""hvdlite for TensorFlow 2: `import hvdlite.tensorflow as hvd` in place of `import horovod.tensorflow as hvd`.

Collectives work eagerly and inside tf.function (not under XLA: see docs/tensorflow.md); Keras 3 support is in
hvdlite.tensorflow.keras.
"""

import tensorflow as _tf

from hvdlite.common.basics import (
    ProcessSet,
    add_process_set,
    build_info,
    cross_rank,
    cross_size,  # noqa: F401
    global_process_set,
    init,
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
from hvdlite.tensorflow import elastic  # noqa: F401,E402 - hvd.elastic.run, TensorFlowKerasState
from hvdlite.tensorflow import errors as _errors
from hvdlite.tensorflow.compression import Compression  # noqa: F401
from hvdlite.tensorflow.functions import (
    BroadcastGlobalVariablesHook,
    allgather_object,  # noqa: F401
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from hvdlite.tensorflow.gradients import DistributedGradientTape, PartialDistributedGradientTape  # noqa: F401
from hvdlite.tensorflow.mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    XlaCompilationError,  # noqa: F401
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from hvdlite.tensorflow.optimizer import DistributedOptimizer  # noqa: F401

_errors.install_status_hook()  # errors inside tf.function keep their hvdlite class


def size_op(process_set_id: int = 0, name=None):
    """The number of ranks (of a process set) as an int32 tensor."""
    ranks = global_process_set.ranks if process_set_id == 0 else _set_ranks(process_set_id)
    return _tf.constant(len(ranks), dtype=_tf.int32, name=name)


def rank_op(name=None):
    return _tf.constant(rank(), dtype=_tf.int32, name=name)


def local_rank_op(name=None):
    return _tf.constant(local_rank(), dtype=_tf.int32, name=name)


def local_size_op(name=None):
    return _tf.constant(local_size(), dtype=_tf.int32, name=name)


def process_set_included_op(process_set_id: int = 0, name=None):
    """1 if this rank belongs to the process set, else 0 (int32 tensor)."""
    ranks = global_process_set.ranks if process_set_id == 0 else _set_ranks(process_set_id)
    return _tf.constant(int(rank() in ranks), dtype=_tf.int32, name=name)


def _set_ranks(process_set_id: int):
    from hvdlite.common.binding import check, ffi, lib

    ranks = ffi.new("int32_t[]", 65536)
    count = ffi.new("int32_t*")
    check(lib.hvdlite_process_set_ranks(process_set_id, ranks, 65536, count))
    return [ranks[i] for i in range(count[0])]


def _executing_eagerly() -> bool:
    """True when TensorFlow executes eagerly here (horovod.tensorflow's helper of the same name)."""
    return _tf.executing_eagerly()


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast of variables from root_rank (Horovod's broadcast_): assigns root_rank's values to the
    variables on every rank of process_set and returns their updated values."""
    variables = list(variables)
    assign = broadcast_variables(variables, root_rank, process_set=process_set, inplace=True, name=name)
    with _tf.control_dependencies([] if assign is None else [assign]):
        return [v.read_value() for v in variables]


def __getattr__(name):
    if name == "SyncBatchNormalization":  # imports keras: only when asked for
        from hvdlite.tensorflow.sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module 'hvdlite.tensorflow' has no attribute {name!r}")
