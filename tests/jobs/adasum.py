# Job script: allreduce(op=Adasum) on a power-of-two number of ranks against a NumPy reference of the algorithm
# (pairwise combination in a binary tree, each tensor on its own), for every float dtype, sizes 0/1/odd/large,
# fused tensors in flight together, pre/postscale, and special inputs (equal, orthogonal, zero, parallel).
# Every rank also checks that all ranks hold bit-identical results.
import numpy as np
import torch
from hvdjob import CheckFailure, check_backend, seed_of

import hvdlite.torch as hvd

hvd.init()
check_backend(hvd)
n, me = hvd.size(), hvd.rank()
assert n & (n - 1) == 0, n
count = 0

# Relative to the largest magnitude of the reference: the half types round every level's result.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two vectors (Horovod's rule: a coefficient is 1 where that vector's squared norm < 1e-8)."""
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / (2.0 * aa) if aa >= 1e-8 else 1.0
    cb = 1.0 - dot / (2.0 * bb) if bb >= 1e-8 else 1.0
    return ca * a + cb * b


def reference(vectors):
    """Ranks (0,1), (2,3), ... first, then the pairs of results, ...; the left operand is the lower group."""
    level = list(vectors)
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def vector(rank: int, key: str, numel: int, kind: str) -> np.ndarray:
    g = torch.Generator().manual_seed(seed_of("adasum", key, rank if kind != "equal" else 0))
    v = torch.randn(numel, generator=g, dtype=torch.float64)
    if kind == "orthogonal":  # disjoint supports: Adasum is the plain sum
        v = torch.where(torch.arange(numel) % n == rank, v, torch.zeros_like(v))
    elif kind == "zero-on-0" and rank == 0:
        v = torch.zeros(numel, dtype=torch.float64)
    elif kind == "parallel":  # same direction, lengths 1..n: Adasum is the mean
        base = torch.randn(
            numel, generator=torch.Generator().manual_seed(seed_of("adasum", key)), dtype=torch.float64
        )
        v = base * (rank + 1)
    return v.numpy()


def inputs(key: str, shape, dtype, kind: str):
    numel = int(np.prod(shape)) if shape else 1
    # Each rank's input as the dtype holds it (rounded), so the reference starts from the same numbers.
    return [torch.from_numpy(vector(r, key, numel, kind)).to(dtype).reshape(shape) for r in range(n)]


def expected(tensors, prescale=1.0, postscale=1.0):
    vectors = [t.to(torch.float64).reshape(-1).numpy() * prescale for t in tensors]
    return reference(vectors) * postscale


def compare(what, got: torch.Tensor, ref: np.ndarray, dtype):
    global count
    if got.dtype != dtype or got.numel() != ref.size:
        raise CheckFailure(f"{what}: got {got.dtype} {tuple(got.shape)}, expected {dtype} of {ref.size} elements")
    g = got.to(torch.float64).reshape(-1).numpy()
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-30)
    err = float(np.abs(g - ref).max()) if ref.size else 0.0
    if err > TOLERANCE[dtype] * scale:
        raise CheckFailure(
            f"{what}: max error {err:.3g} (> {TOLERANCE[dtype]} x {scale:.3g}); got "
            f"{g[:4].tolist()}, expected {ref[:4].tolist()}"
        )
    # identical on every rank
    everyone = hvd.allgather(
        got.reshape(1, -1).contiguous().view(torch.uint8) if got.numel() else torch.zeros(1, 0, dtype=torch.uint8),
        name=f"same.{what}",
    )
    if not all(torch.equal(everyone[0], everyone[r]) for r in range(n)):
        raise CheckFailure(f"{what}: ranks hold different results")
    count += 1


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHAPES = {"zero": (0,), "one": (1,), "odd": (17,), "2d": (7, 143), "large": (1001, 300)}
KINDS = ["random", "equal", "orthogonal", "zero-on-0", "parallel"]

for dtype in DTYPES:
    for size, shape in SHAPES.items():
        for kind in KINDS if size in ("odd", "large") else ["random"]:
            key = f"{dtype}.{size}.{kind}"
            tensors = inputs(key, shape, dtype, kind)
            got = hvd.allreduce(tensors[me], name=key, op=hvd.Adasum)
            compare(key, got, expected(tensors), dtype)

# Fused: many tensors in flight at once (fusion packs them into one buffer); each combines with its own norms.
for dtype in DTYPES:
    shapes = [(3,), (100,), (5, 7), (1,), (2000,), (33, 3), (0,), (64,)]
    tensors = [inputs(f"fused.{dtype}.{i}", s, dtype, "random") for i, s in enumerate(shapes)]
    handles = [hvd.allreduce_async(t[me], name=f"fused.{dtype}.{i}", op=hvd.Adasum) for i, t in enumerate(tensors)]
    for i, (h, t) in enumerate(zip(handles, tensors)):
        compare(f"fused.{dtype}.{i}", hvd.synchronize(h), expected(t), dtype)

# prescale and postscale apply before and after, as for any allreduce (Adasum itself is scale-free)
for dtype in (torch.float32, torch.float64):
    tensors = inputs(f"scaled.{dtype}", (999,), dtype, "random")
    got = hvd.allreduce(tensors[me], name=f"scaled.{dtype}", op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0)
    compare(f"scaled.{dtype}", got, expected(tensors, 0.5, 3.0), dtype)

# In place
t = inputs("inplace", (50,), torch.float32, "random")
mine = t[me].clone()
hvd.allreduce_(mine, name="inplace", op=hvd.Adasum)
compare("inplace", mine, expected(t), torch.float32)

print(f"OK {count}", flush=True)
hvd.shutdown()
