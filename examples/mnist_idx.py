"""Reading MNIST's IDX files (gzipped or not), shared by the PyTorch and Keras examples."""

import gzip
import math
import os
import struct

import numpy as np


def read_idx(path):
    """Parses an IDX file: magic (2 zero bytes, dtype code 0x08 = unsigned byte, ndim), big-endian dims, data."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        zero, dtype_code, ndim = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype_code != 0x08:
            raise ValueError(f"{path} is not an unsigned-byte IDX file")
        shape = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        data = np.frombuffer(f.read(), dtype=np.uint8)
    if data.size != math.prod(shape):
        raise ValueError(f"{path}: expected {math.prod(shape)} values, found {data.size}")
    return data.reshape(shape)


def load_split(root, train):
    """(images as float32 normalised with MNIST's usual constants, labels as int64) of one split."""
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    return ((images.astype(np.float32) / 255.0) - 0.1307) / 0.3081, labels
