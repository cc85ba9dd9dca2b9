"""One rank of tests/test_multihost.py's hierarchical allreduce check: allreduces of int32 and float32 buffers
(numpy, straight through the core), results saved to OUT_DIR/<label>.<rank>.npz.

argv: OUT_DIR LABEL ELEMENTS REPEATS. The same inputs on every run (seeded by rank), so runs with
HVDLITE_HIERARCHICAL_ALLREDUCE=0 and =1 can be compared; REPEATS more int32 allreduces follow, to move enough
bytes for the test to count them on the host's link."""

import os
import sys

import numpy as np
from numpy_collectives import allreduce

from hvdlite.common import basics

out_dir, label, elements, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
basics.init()
rank = basics.rank()
rng = np.random.default_rng(100 + rank)
inputs = {
    "ints": rng.integers(-1000, 1000, elements, dtype=np.int32),
    "floats": rng.standard_normal(elements, dtype=np.float32),
    "odd": rng.integers(-9, 9, 1001, dtype=np.int32),
}  # a count that does not split evenly
for i in range(repeats):
    inputs[f"repeat{i}"] = inputs["ints"].copy()
results = {}
for name, data in inputs.items():
    results[name] = allreduce(data, name, out=np.empty_like(data))
np.savez(os.path.join(out_dir, f"{label}.{rank}.npz"), **{k: results[k] for k in ("ints", "floats", "odd")})
basics.shutdown()
