"""Variable and object helpers (horovod.tensorflow.functions): broadcast_variables, broadcast_object,
allgather_object, and the TF1 graph-mode broadcast_global_variables / BroadcastGlobalVariablesHook."""

from typing import Any, List

import cloudpickle
import numpy as np
import tensorflow as tf

from hvdlite.common.basics import OP_BROADCAST, global_process_set, rank
from hvdlite.tensorflow import bridge

# A broadcast copies bytes, so any numeric dtype travels as a supported one of the same width.
_CARRIER = {1: tf.uint8, 2: tf.float16, 4: tf.int32, 8: tf.int64}


def _carrier(dtype: tf.DType) -> tf.DType:
    if dtype in bridge.SUPPORTED_DTYPES:
        return dtype
    if dtype == tf.string or dtype.size not in _CARRIER:
        raise TypeError(f"hvdlite: cannot broadcast variables of dtype {dtype.name}")
    return _CARRIER[dtype.size]


def broadcast_variables(
    variables, root_rank: int, process_set=global_process_set, inplace: bool = False, name: str = None
):
    """Assigns root_rank's value to every variable on every rank of process_set: one broadcast per dtype
    (variables flattened and concatenated), eager or inside a tf.function (where it returns the assign op)."""
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    prefix = name or "broadcast_variables"
    buckets = {}  # carrier dtype -> [(variable, value)]
    for v in variables:
        dtype = tf.as_dtype(v.dtype).base_dtype  # a TF1 reference variable's dtype is e.g. bool_ref
        value = tf.convert_to_tensor(v)
        carrier = _carrier(dtype)
        if carrier != dtype:
            value = tf.bitcast(value, carrier)
        buckets.setdefault(carrier, []).append((v, value))
    ps_id = bridge.process_set_id(process_set)
    collectives, inputs = [], []
    for dtype, members in buckets.items():
        buffer = (
            tf.reshape(members[0][1], [-1])
            if len(members) == 1
            else tf.concat([tf.reshape(value, [-1]) for _, value in members], axis=0)
        )
        collectives.append(
            bridge.Collective(
                OP_BROADCAST,
                f"{prefix}.{dtype.name}",
                root_rank=int(root_rank),
                process_set_id=ps_id,
                in_place=len(members) > 1,
            )
        )
        inputs.append(buffer)
    outputs = bridge.call(
        collectives, inputs, [i.dtype for i in inputs], [i.shape for i in inputs], "broadcast_variables"
    )
    assigns = []
    for received, members in zip(outputs, buckets.values()):
        sizes = [
            int(np.prod(value.shape.as_list())) if value.shape.is_fully_defined() else tf.size(value)
            for _, value in members
        ]
        pieces = tf.split(received, sizes) if len(members) > 1 else [received]
        for (v, value), piece in zip(members, pieces):
            piece = tf.reshape(piece, tf.shape(value))
            dtype = tf.as_dtype(v.dtype).base_dtype
            if piece.dtype != dtype:
                piece = tf.bitcast(piece, dtype)
            assigns.append(v.assign(piece))
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_global_variables(root_rank: int):
    """TF1 graph mode: an op broadcasting every global variable from root_rank."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution; use "
            "hvd.broadcast_variables(model.variables + optimizer.variables, root_rank) instead"
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """TF1 SessionRunHook: broadcasts the global variables from root_rank once the session is created."""

    def __init__(self, root_rank: int, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def _dumps(obj) -> np.ndarray:
    return np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)


def broadcast_object(
    obj: Any, root_rank: int = 0, session=None, name: str = None, process_set=global_process_set
) -> Any:
    """Returns root_rank's obj on every rank (serialised with cloudpickle, so lambdas and local classes work).
    Runs in Python (eager or not); `session` is accepted for Horovod compatibility and unused."""
    name = name or "object"  # must not depend on obj: non-root ranks usually pass None
    if rank() == root_rank:
        payload = _dumps(obj)
        length = np.array([payload.size], dtype=np.int64)
    else:
        payload, length = None, np.zeros(1, dtype=np.int64)
    length = bridge.np_broadcast(length, root_rank, f"broadcast_object.{name}.length", process_set)
    if payload is None:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    received = bridge.np_broadcast(payload, root_rank, f"broadcast_object.{name}.data", process_set)
    return obj if rank() == root_rank else cloudpickle.loads(received.tobytes())


def broadcast_object_fn(root_rank: int = 0, session=None, name: str = None, process_set=global_process_set):
    """Returns a function that broadcasts its argument from root_rank (Horovod's broadcast_object_fn)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session=None, name: str = None, process_set=global_process_set) -> List[Any]:
    """Returns the list of every rank's obj, in rank order of the process set."""
    name = name or "object"
    gathered = bridge.allgather_bytes(
        cloudpickle.dumps(obj), f"allgather_object.{name}", bridge.process_set_id(process_set)
    )
    return [cloudpickle.loads(payload) for payload in gathered]
