"""hvdlite for Keras 3 on the TensorFlow backend: `import hvdlite.tensorflow.keras as hvd` in place of
`import horovod.tensorflow.keras as hvd`.

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())), loss=...)
    model.fit(x_shard, y_shard, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                           hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)
"""

import keras as _keras
import tensorflow as _tf

from hvdlite.common.basics import (
    ProcessSet,
    add_process_set,
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
from hvdlite.common.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from hvdlite.tensorflow import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,  # noqa: F401
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from hvdlite.tensorflow import mpi_ops as _ops
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.functions import allgather_object, broadcast_object, broadcast_variables  # noqa: F401
from hvdlite.tensorflow.keras import (
    callbacks,  # noqa: F401
    elastic,  # noqa: F401 - hvd.elastic.run, KerasState, the state callbacks
)
from hvdlite.tensorflow.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer  # noqa: F401
from hvdlite.tensorflow.mpi_ops import XlaCompilationError, barrier, join  # noqa: F401
from hvdlite.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401

if not _keras.__version__.startswith("3."):
    raise ImportError(f"hvdlite.tensorflow.keras supports Keras 3; found keras {_keras.__version__}")


def allreduce(
    value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None, compression=Compression.none
):
    """Averages (or reduces with op) a tensor or array-like value over the ranks; returns a tensor."""
    return _ops.allreduce(
        _tf.convert_to_tensor(value),
        average=average,
        name=name,
        op=op,
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )


def allgather(value, name=None):
    return _ops.allgather(_tf.convert_to_tensor(value), name=name)


def broadcast(value, root_rank, name=None):
    return _ops.broadcast(_tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    return _ops.reducescatter(_tf.convert_to_tensor(value), name=name, op=op)


def broadcast_global_variables(root_rank):
    """Keras 2 / TF1 sessions only in Horovod; with Keras 3 use callbacks.BroadcastGlobalVariablesCallback
    (in fit) or broadcast_variables(model.variables + optimizer.variables, root_rank)."""
    raise RuntimeError(
        "broadcast_global_variables needs a TF1 session; with Keras 3 use "
        "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) or "
        "hvd.broadcast_variables(model.weights + optimizer.variables, root_rank)"
    )


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none, **kwargs):
    """Loads a model saved by model.save() (with or without hvdlite) and wraps its optimizer, restored with
    its state, in DistributedOptimizer(compression=compression, **kwargs)."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects.setdefault(cls.__name__, cls)
    objects.setdefault("SyncBatchNormalization", SyncBatchNormalization)
    model = _keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not isinstance(optimizer, _ops_distributed_class()):
        wrapped = DistributedOptimizer(optimizer, compression=compression, **kwargs)
        if wrapped is not optimizer:  # wrapped in a LossScaleOptimizer under mixed_float16
            model.optimizer = wrapped
        model.train_function = None  # retrace with the distributed apply
    return model


def _ops_distributed_class():
    from hvdlite.tensorflow.keras.optimizer import _DistributedOptimizer

    return _DistributedOptimizer
