"""Allreduces of 1 KB, 1 MB and 16 MB checked against the expected sums, then one line with the transports the
rank uses. tests/test_shm_room.py runs it with a small /dev/shm."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from numpy_collectives import allreduce  # noqa: E402

from hvdlite.common import basics  # noqa: E402

basics.init()
rank, size = basics.rank(), basics.size()
for count in (256, 256 << 10, 4 << 20):
    out = allreduce(np.full(count, rank + 1, dtype=np.float32), "sum.%d" % count)
    assert (out == size * (size + 1) / 2).all(), (count, out[:4])
info = dict(item.split("=", 1) for item in basics.build_info().split(";") if "=" in item)
print("OK rank=%d shm_peers=%s tcp_peers=%s" % (rank, info["shm_peers"], info["tcp_peers"]), flush=True)
basics.shutdown()
