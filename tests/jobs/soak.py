"""Soak: many collectives of random kinds, sizes and process sets on every rank, checking each result and that
memory, file descriptors and shared memory stay flat (tests/test_soak.py).

argv: OPS [WARMUP] (default OPS/10: the operations after which memory counts as warmed up). All ranks draw the same
random sequence (a shared seed), so they issue the same collectives; an operation on a process set is issued by its
members only. Operations go out in asynchronous batches of 1-8 (fused and negotiated together), names cycle through a
pool so the response cache is hit, missed and displaced. Prints one line: SOAK <json> with the descriptor counts after
warm-up and at the end, and, every 500 operations after warm-up, three measures of the memory held: the resident
size, the bytes malloc has handed out and not had back (the core's C++ heap, numpy's buffers, cffi's structs) and
the number of Python objects' blocks.

Each sample is taken where nothing is in flight, after emptying what is bounded but churns: the binding's cache of
prepared requests (keyed by buffer address, so every fresh numpy array adds an entry until 4096 clear it; the churn
scattered Python's arenas and raised the resident size by up to 4 MB, once, at a random point), the garbage
collector's pending cycles, and the free pages glibc keeps. What is left is what the process holds."""

import ctypes
import gc
import json
import os
import random
import sys
import time

import numpy as np

from hvdlite.common import basics, ops

total_ops = int(sys.argv[1])
warmup_ops = int(sys.argv[2]) if len(sys.argv) > 2 else total_ops // 10
basics.init()
rank, size = basics.rank(), basics.size()
sets = [basics.global_process_set] + [
    basics.add_process_set(members) for members in ([0, 1], [2, 3], [0, 2]) if max(members) < size
]
rng = random.Random(2026)
libc = ctypes.CDLL(None)


class MallocInfo(ctypes.Structure):
    """glibc's struct mallinfo2 (2.33 and later)."""

    _fields_ = [
        (field, ctypes.c_size_t)
        for field in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


libc.mallinfo2.restype = MallocInfo
F32, I32 = ops.DTYPE_CODES["float32"], ops.DTYPE_CODES["int32"]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def malloc_bytes_in_use() -> int:
    """Bytes in allocated chunks, every arena and the mmapped ones: what malloc has handed out and not had back."""
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def issue(kind, process_set, count, dtype, name):
    """Enqueues one collective; returns (handle, check) where check() verifies the result after the wait."""
    members = process_set.ranks
    n = len(members)
    np_dtype = np.float32 if dtype == F32 else np.int32
    common = dict(name=name, dtype=dtype, process_set_id=process_set.process_set_id)
    if kind == "allreduce":
        buffer = np.full(count, rank + 1, dtype=np_dtype)
        handle = ops.submit(
            ops.request(
                op=basics.OP_ALLREDUCE,
                shape=(count,),
                input_ptr=buffer.ctypes.data,
                output_ptr=buffer.ctypes.data,
                reduce_op=ops.core_reduce_op(ops.Sum),
                **common,
            )
        )
        expected = sum(m + 1 for m in members)
        return handle, lambda: bool((buffer == expected).all())
    if kind == "broadcast":
        root = members[count % n]
        buffer = np.full(count, rank, dtype=np_dtype)
        handle = ops.submit(
            ops.request(
                op=basics.OP_BROADCAST,
                shape=(count,),
                input_ptr=buffer.ctypes.data,
                output_ptr=buffer.ctypes.data,
                root_rank=root,
                **common,
            )
        )
        return handle, lambda: bool((buffer == root).all())
    rows = count // n or 1
    source = np.full(rows * n if kind != "allgather" else rows, rank, dtype=np_dtype)
    op = {"allgather": basics.OP_ALLGATHER, "alltoall": basics.OP_ALLTOALL, "reducescatter": basics.OP_REDUCESCATTER}[
        kind
    ]
    extra = dict(reduce_op=ops.core_reduce_op(ops.Sum)) if kind == "reducescatter" else {}
    handle = ops.submit(
        ops.request(op=op, shape=source.shape, input_ptr=source.ctypes.data, output_ptr=0, **common, **extra)
    )

    def check():
        shape = ops.output_shape(handle)
        out = np.empty(shape, dtype=np_dtype)
        if out.nbytes:
            ops.copy_output(handle, out.ctypes.data, out.nbytes)
        _ = source  # alive until the operation finished
        if kind == "allgather":
            return out.tolist() == [m for m in members for _ in range(rows)]
        if kind == "alltoall":
            return out.tolist() == [m for m in members for _ in range(rows)]
        return bool((out == sum(members)).all()) and len(out) == rows

    return handle, check


KINDS = ["allreduce"] * 4 + ["allgather", "broadcast", "alltoall", "reducescatter"]
LARGEST_COUNT = 300000
LARGEST_BATCH = 8


def reach_high_water_marks():
    """The fusion buffer and the transport's scratch grow to the largest batch they have seen and keep that size; a
    large batch the random sequence draws only late would raise the memory held once, which the flatness check cannot
    tell from a leak. So every set runs the largest batch of every kind first."""
    for process_set in sets:
        if rank not in process_set.ranks:
            continue
        for kind in dict.fromkeys(KINDS):
            batch = [
                issue(kind, process_set, LARGEST_COUNT, F32, f"soak.warm.{kind}.{i}") for i in range(LARGEST_BATCH)
            ]
            for handle, check in batch:
                ops.wait(handle)
                if not check():
                    raise AssertionError(f"rank {rank}: wrong result for the largest {kind} batch")
                ops.release(handle)


def memory_held() -> tuple:
    """(resident bytes, malloc bytes in use, Python blocks) after emptying the churning caches (module docstring)."""
    ops._prepared.clear()
    gc.collect()
    libc.malloc_trim(0)
    return rss_bytes(), malloc_bytes_in_use(), sys.getallocatedblocks()


reach_high_water_marks()
done = 0
warm = None
samples = []
next_sample = warmup_ops
start = time.monotonic()
while done < total_ops:
    batch = []
    names_in_batch = set()
    for _ in range(rng.randint(1, 8)):
        process_set = rng.choice(sets)
        kind = rng.choice(KINDS)
        count = rng.choice([1, 7, 64, 1000, 4096, 20000]) if rng.random() < 0.97 else LARGEST_COUNT
        dtype = rng.choice([F32, I32])
        name = f"soak.{kind}.{rng.randrange(48)}"
        done += 1
        if rank not in process_set.ranks or (process_set.process_set_id, name) in names_in_batch:
            continue
        names_in_batch.add((process_set.process_set_id, name))
        batch.append((name, issue(kind, process_set, count, dtype, name)))
    for name, (handle, check) in batch:
        ops.wait(handle)
        if not check():
            raise AssertionError(f"rank {rank}: wrong result for {name} after {done} operations")
        ops.release(handle)
    if warm is None and done >= warmup_ops:
        warm = (rss_bytes(), fd_count())
    if done >= next_sample:
        samples.append(memory_held())
        next_sample += 500
elapsed = time.monotonic() - start
report = {
    "rank": rank,
    "ops": done,
    "seconds": round(elapsed, 1),
    "rss_warm": warm[0],
    "rss_end": rss_bytes(),
    "fds_warm": warm[1],
    "fds_end": fd_count(),
    "rss_samples": [sample[0] for sample in samples],
    "malloc_samples": [sample[1] for sample in samples],
    "block_samples": [sample[2] for sample in samples],
}
basics.shutdown()
print("SOAK " + json.dumps(report), flush=True)
