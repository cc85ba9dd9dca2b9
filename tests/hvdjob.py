"""Shared helpers for the multi-rank job scripts and the in-process tests.

Job scripts import this module (``tests/`` is put on ``sys.path`` by :func:`prelude`).  Every rank builds the
inputs of *every* rank with :func:`make`, a deterministic function of ``(rank, key)``, so each rank can compute
the expected result of a collective locally and compare (exactly where the arithmetic is exact, otherwise with a
dtype-dependent tolerance).
"""

from __future__ import annotations

import os
import re
import zlib
from typing import Dict, Iterable, List, Optional, Sequence

import torch

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# uint16 needs torch >= 2.3 (which has few kernels for it: the tests only copy, compare and convert it).
_UINT16 = [torch.uint16] if hasattr(torch, "uint16") else []
ALL_DTYPES = [
    torch.uint8,
    torch.int8,
    *_UINT16,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
]
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.uint8, torch.int8, *_UINT16, torch.int16, torch.int32, torch.int64)
UNSIGNED_DTYPES = (torch.uint8, *_UINT16)

# Shapes for the sizes 0, 1, odd and large (> 64 KiB for every dtype: ring / single-copy paths).
SHAPES = {"zero": (0, 3), "one": (1,), "odd": (17,), "odd2d": (7, 143), "large": (1001, 300)}


def prelude() -> str:
    """Source to put at the top of a job script: makes ``import hvdjob`` work on every rank."""
    return f"import sys\nsys.path.insert(0, {TESTS_DIR!r})\n"


def seed_of(*parts) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


_POOL_SIZE = 1 << 21
_base_pools: Dict[int, torch.Tensor] = {}
_pools: Dict[tuple, torch.Tensor] = {}


def _pool(rank: int, lo: int, hi: int) -> torch.Tensor:
    """A fixed random vector per (rank, value range), int8 in [lo, hi]; make() slices it, which is far cheaper
    than drawing fresh random numbers for every large case."""
    if (rank, lo, hi) not in _pools:
        if rank not in _base_pools:
            g = torch.Generator().manual_seed(seed_of("pool", rank))
            _base_pools[rank] = torch.randint(0, 1 << 20, (_POOL_SIZE,), generator=g)
        _pools[rank, lo, hi] = (_base_pools[rank] % (hi - lo + 1) + lo).to(torch.int8)
    return _pools[rank, lo, hi]


def make(rank: int, key, shape: Sequence[int], dtype: torch.dtype, lo: int = -3, hi: int = 3) -> torch.Tensor:
    """Rank ``rank``'s input for case ``key``: small integers in [lo, hi] (lo clamped to 0 for unsigned; bool:
    random). Deterministic in (rank, key, shape, dtype, lo, hi), so every rank can rebuild every rank's input."""
    shape = tuple(int(s) for s in shape)
    numel = 1
    for s in shape:
        numel *= s
    if numel > _POOL_SIZE:
        raise ValueError(f"make(): {numel} elements is more than the pool holds")
    if dtype == torch.bool:
        lo, hi = 0, 1
    elif dtype in UNSIGNED_DTYPES:
        lo = max(lo, 0)
    assert -128 <= lo <= hi <= 127
    offset = seed_of(rank, key, dtype) % (_POOL_SIZE - numel + 1)
    return _pool(rank, lo, hi)[offset : offset + numel].to(dtype, copy=True).reshape(shape)


def value_range(op: str, dtype: torch.dtype):
    """Input value range that keeps every reduction over <= 4 ranks exact and in range."""
    if op == "Product":
        return (0, 3) if dtype in UNSIGNED_DTYPES else (-2, 2)
    if op in ("Sum", "Average") and dtype in UNSIGNED_DTYPES:
        return (0, 5)
    return (-4, 4)


def horovod_scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """x * factor by Horovod's CPU rule (ScaleBuffer), in x's dtype: integers multiply in float64 and truncate
    toward zero (wrapping to the dtype's width); float16/bfloat16 widen to float32, multiply by the factor
    rounded to float32 and round back to nearest-even; float32 uses the factor rounded to float32."""
    if factor == 1.0 or x.dtype == torch.bool:
        return x.clone()
    if x.dtype in FLOAT_DTYPES:
        if x.dtype == torch.float64:
            return x * factor
        return (x.to(torch.float32) * torch.tensor(factor, dtype=torch.float32)).to(x.dtype)
    return torch.trunc(x.to(torch.float64) * factor).to(torch.int64).to(x.dtype)


def reduce_reference(
    inputs: List[torch.Tensor], op: str, dtype: torch.dtype, prescale: float = 1.0, postscale: float = 1.0
) -> torch.Tensor:
    """What allreduce/reducescatter should compute, in float64 (floats), int64 (ints) or bool; cast to dtype.

    Integers: prescale, then postscale (postscale / n for Average) by Horovod's rule (horovod_scale: the product
    in float64, truncated toward zero), on the values as the dtype holds them.
    """
    n = len(inputs)
    if dtype == torch.bool:
        stacked = torch.stack([t.to(torch.bool) for t in inputs])
        if op in ("Sum", "Max"):
            return stacked.any(0)
        if op in ("Min", "Product"):
            return stacked.all(0)
        raise ValueError(op)
    is_float = dtype in FLOAT_DTYPES
    xs = [t.to(torch.float64) for t in inputs] if is_float else [t.to(torch.int64) for t in inputs]
    if prescale != 1.0:
        xs = (
            [x * prescale for x in xs]
            if is_float
            else [horovod_scale(x.to(dtype), prescale).to(torch.int64) for x in xs]
        )
    stacked = torch.stack(xs)
    if op in ("Sum", "Average"):
        result = stacked.sum(0)
    elif op == "Min":
        result = stacked.min(0).values
    elif op == "Max":
        result = stacked.max(0).values
    elif op == "Product":
        result = stacked.prod(0)
    else:
        raise ValueError(op)
    post = postscale / n if op == "Average" else postscale
    if post != 1.0:
        result = result * post if is_float else horovod_scale(result.to(dtype), post)
    return result.to(dtype)


TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}


class CheckFailure(AssertionError):
    pass


def check(what: str, got, expected: torch.Tensor, exact: bool = True) -> None:
    """Raises CheckFailure with a readable message unless got == expected (dtype, shape and values)."""
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"{what}: expected a tensor, got {type(got).__name__}: {got!r}")
    if got.dtype != expected.dtype:
        raise CheckFailure(f"{what}: dtype {got.dtype}, expected {expected.dtype}")
    if tuple(got.shape) != tuple(expected.shape):
        raise CheckFailure(f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    if got.numel() == 0 or (exact and torch.equal(got, expected)):
        return
    if exact or expected.dtype not in FLOAT_DTYPES:
        bad = got != expected
    else:
        tol = TOLERANCE[expected.dtype]
        g, e = got.to(torch.float64), expected.to(torch.float64)
        bad = (g - e).abs() > tol * (1 + e.abs())
    if bool(bad.any()):
        idx = bad.reshape(-1).nonzero()[0].item()
        count = int(bad.sum())
        raise CheckFailure(
            f"{what}: {count} of {got.numel()} elements differ; first at flat index {idx}: got "
            f"{got.reshape(-1)[idx].item()!r}, expected {expected.reshape(-1)[idx].item()!r}"
        )


def even_rows(rows: int, n: int) -> List[int]:
    """Reducescatter's row split: the first rows % n ranks get one extra row."""
    return [rows // n + (1 if i < rows % n else 0) for i in range(n)]


def expect_raises(what: str, exc_type, fn, *args, match: Optional[Iterable[str]] = None, **kwargs):
    """Calls fn and returns the exception; raises CheckFailure unless it raises exc_type mentioning `match`."""
    try:
        result = fn(*args, **kwargs)
    except exc_type as e:  # noqa: PERF203
        message = str(e)
        for fragment in match or ():
            if fragment not in message:
                raise CheckFailure(f"{what}: {type(e).__name__} message lacks {fragment!r}: {message!r}") from e
        return e
    except BaseException as e:
        raise CheckFailure(f"{what}: expected {exc_type.__name__}, got {type(e).__name__}: {e}") from e
    raise CheckFailure(f"{what}: expected {exc_type.__name__}, but it returned {result!r}")


def parse_build_info(info: str) -> Dict[str, str]:
    return dict(kv.split("=", 1) for kv in info.split(";") if "=" in kv)


def usable_cpus() -> int:
    """The CPUs this process may use, as the core counts them: the affinity mask, capped by a cgroup v2 quota."""
    cpus = len(os.sched_getaffinity(0))
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def expected_caller_spin(machine_ranks: int) -> int:
    """The spin budget of a waiting framework thread: the knob where given, else long where the ranks on this
    machine (emulated hosts included) have a CPU each."""
    knob = os.environ.get("HVDLITE_SPIN_MICROSECONDS") or os.environ.get("HOROVOD_SPIN_MICROSECONDS")
    if knob:
        return int(knob)
    return 5000 if machine_ranks <= usable_cpus() else 50


def voluntary_switches() -> int:
    """This process's voluntary context switches so far (a thread's sleeps), summed over its threads."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def launched_size() -> int:
    """The job size the launcher announced: the built-in starter's HVDLITE_SIZE, or Open MPI's."""
    return int(os.environ.get("HVDLITE_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or "1")


def check_backend(hvd) -> None:
    """With EXPECT_BACKEND set (builtin or mpi), proves the job moves its tensors through that backend."""
    expected = os.environ.get("EXPECT_BACKEND")
    if expected:
        info = parse_build_info(hvd.build_info())
        if info.get("cpu_operations") != expected:
            raise CheckFailure(f"expected the {expected} backend, build_info says {info.get('cpu_operations')}")
        if (expected == "mpi") != hvd.mpi_enabled():
            raise CheckFailure(f"mpi_enabled() is {hvd.mpi_enabled()} on the {expected} backend")


def prefill_cache(hvd) -> None:
    """With HVDJOB_CACHE_PREFILL=N: N named broadcasts cached before the job proper, so that each block of the
    negotiation's votes spans N / 64 words or more and travels as a window (hvdlite_core/src/runtime/vote_exchange.h)
    rather than whole, and the job's own operations sit at cache positions past them. Broadcasts never take the
    eager region, so its layout stays what the job expects."""
    t = torch.zeros(1)
    for i in range(int(os.environ.get("HVDJOB_CACHE_PREFILL", "0"))):
        hvd.broadcast_(t, 0, name=f"prefill.{i}")


def ok_ranks(stdout: str, tag: str = "OK") -> Dict[int, str]:
    """{rank: rest of line} for every ``[<rank>]<stdout>: <tag> ...`` line."""
    found = {}
    for line in stdout.splitlines():
        m = re.fullmatch(r"\[(\d+)\]<stdout>: " + re.escape(tag) + r"(?: (.*))?", line)
        if m:
            found[int(m.group(1))] = m.group(2) or ""
    return found


def assert_job_ok(result, np: int, tag: str = "OK", min_count: int = 1) -> Dict[int, str]:
    """The job exited 0 and every rank printed ``<tag> <count>`` with count >= min_count."""
    detail = (
        f"exit code {result.returncode}\n--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n"
        f"{result.stderr[-6000:]}"
    )
    assert result.returncode == 0, detail
    found = ok_ranks(result.stdout, tag)
    assert sorted(found) == list(range(np)), f"ranks with an {tag} line: {sorted(found)}\n{detail}"
    for r, rest in found.items():
        count = int(rest.split()[0])
        assert count >= min_count, f"rank {r} checked only {count} cases (< {min_count})\n{detail}"
    return found


def synchronize_within(hvd, handle, seconds: float, what: str):
    """hvd.synchronize(handle), but raises CheckFailure instead of hanging if it is not done within `seconds`."""
    import time

    deadline = time.monotonic() + seconds
    while not hvd.poll(handle):
        if time.monotonic() > deadline:
            raise CheckFailure(f"{what}: not finished after {seconds} s (hang)")
        time.sleep(0.01)
    return hvd.synchronize(handle)
