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

