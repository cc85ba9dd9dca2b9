"""Allreduce of a numpy array straight through the core (no framework import, so a job starts in a fraction of
a second), for the job scripts in this folder; a script's own folder is on its import path."""

import numpy as np

from hvdlite.common import basics, ops


def allreduce(data: np.ndarray, name: str, out: np.ndarray = None, op=ops.Sum) -> np.ndarray:
    """Waits for the allreduce of ``data`` into ``out`` (default: in place) and returns ``out``."""
    out = data if out is None else out
    handle = ops.submit(
        ops.request(
            op=basics.OP_ALLREDUCE,
            name=name,
            dtype=ops.DTYPE_CODES[str(data.dtype)],
            shape=data.shape,
            input_ptr=data.ctypes.data,
            output_ptr=out.ctypes.data,
            reduce_op=ops.core_reduce_op(op),
        )
    )
    try:
        ops.wait(handle)
    finally:
        ops.release(handle)
    return out


def allgather(data: np.ndarray, name: str) -> np.ndarray:
    """Waits for the allgather of ``data`` (rows along the first dimension) and returns every rank's rows."""
    handle = ops.submit(
        ops.request(
            op=basics.OP_ALLGATHER,
            name=name,
            dtype=ops.DTYPE_CODES[str(data.dtype)],
            shape=data.shape,
            input_ptr=data.ctypes.data,
            output_ptr=0,
        )
    )
    try:
        ops.wait(handle)
        out = np.empty(ops.output_shape(handle), dtype=data.dtype)
        ops.copy_output(handle, out.ctypes.data, out.nbytes)
    finally:
        ops.release(handle)
    return out


def broadcast_object(obj, root: int, name: str = "object"):
    """rank root's obj on every rank (pickled, then its length and its bytes broadcast)."""
    import pickle

    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy() if basics.rank() == root else None
    length = np.array([0 if data is None else data.size], dtype=np.int64)
    _broadcast(length, root, f"{name}.length")
    if data is None:
        data = np.empty(int(length[0]), dtype=np.uint8)
    _broadcast(data, root, f"{name}.bytes")
    return obj if basics.rank() == root else pickle.loads(data.tobytes())


def _broadcast(data: np.ndarray, root: int, name: str) -> None:
    handle = ops.submit(
        ops.request(
            basics.OP_BROADCAST,
            name,
            ops.DTYPE_CODES[str(data.dtype)],
            data.shape,
            data.ctypes.data,
            data.ctypes.data,
            root_rank=root,
        )
    )
    try:
        ops.wait(handle)
    finally:
        ops.release(handle)
