"""Every reduce op on two dtypes at sizes around the probe sizes, each checked against numpy; each rank then
prints its build info's algorithm settings (INFO) and how many checks passed (OK), for the test to read. With
QUICK_CHECK, fewer sizes."""

import json
import os

import numpy as np
from numpy_collectives import allreduce

from hvdlite.common import basics, ops

basics.init()
n, me = basics.size(), basics.rank()
checked = 0
# Sizes around the probe sizes (4 KB ... 16 MB) and odd counts, every reduce op the kernels offer, two dtypes.
counts = (1, 3, 1000, 3001, 9000, 70001, 300000, 1 << 20, (4 << 20) + 5)
for count in counts[:3] + counts[5:6] if os.environ.get("QUICK_CHECK") else counts:
    for dtype in (np.float32, np.int32):
        for op, reference in (
            (ops.Sum, lambda xs: sum(xs)),
            (ops.Max, lambda xs: np.maximum.reduce(xs)),
            (ops.Min, lambda xs: np.minimum.reduce(xs)),
            (ops.Average, lambda xs: sum(xs) / n),
        ):
            if op == ops.Average and dtype != np.float32:
                continue
            inputs = [((np.arange(count) * (r + 3)) % 1009 - 500 + r).astype(dtype) for r in range(n)]
            out = allreduce(inputs[me].copy(), "t.%d.%s.%s" % (count, np.dtype(dtype).name, op), op=op)
            expected = reference(inputs).astype(dtype)
            if op == ops.Average:  # the sum is exact; dividing by n rounds once, at most
                assert np.allclose(out, expected, rtol=1e-6, atol=0), (count, dtype, op)
            else:
                assert np.array_equal(out, expected), (count, dtype, op)
            checked += 1
info = dict(kv.split("=", 1) for kv in basics.build_info().split(";") if "=" in kv)
streaming = ("streaming_store_bytes", "streaming_store_bytes_from", "STREAMING_STORE_BYTES")
shown = {k: v for k, v in info.items() if k.startswith("allreduce_") or k in streaming}
shown["ALLREDUCE_ALGORITHMS"] = info["ALLREDUCE_ALGORITHMS"]
print("INFO %d %s" % (me, json.dumps(shown)), flush=True)
print("OK %d" % checked, flush=True)
basics.shutdown()
