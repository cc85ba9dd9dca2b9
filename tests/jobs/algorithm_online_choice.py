"""STEPS rounds of allreduces in three size bands, exact in any summation order, then a small one; each rank
prints its online choice's counters (INFO) and how many checks passed (OK)."""

import json
import os

import numpy as np
from numpy_collectives import allreduce

from hvdlite.common import basics

basics.init()
n, me = basics.size(), basics.rank()
# Integer values in float32: exact in any order of summation, so ring and single copy give the same bits.
checked = 0
for step in range(int(os.environ["STEPS"])):
    for count in (70000, 300001, 1 << 20):  # 280 KB, 1.2 MB, 4 MB: three bands
        inputs = [((np.arange(count) * (r + 3) + step) % 1009 - 500).astype(np.float32) for r in range(n)]
        out = allreduce(inputs[me].copy(), "a.%d" % count)
        assert np.array_equal(out, sum(inputs)), (step, count)
        checked += 1
small = allreduce(np.arange(1000, dtype=np.float32), "small")  # below the adaptive sizes
assert np.array_equal(small, n * np.arange(1000, dtype=np.float32))
info = dict(kv.split("=", 1) for kv in basics.build_info().split(";") if "=" in kv)
print("INFO %d %s" % (me, json.dumps({k: v for k, v in info.items() if k.startswith("adaptive_")})), flush=True)
print("OK %d" % checked, flush=True)
basics.shutdown()
