# Job script: the NCCL data plane (CUDA tensors) through hvdlite.torch, on the fake CUDA runtime and NCCL of
# tests/fake_cuda (no GPU needed: their "device" memory is host memory). CPU tensors stand in for CUDA tensors
# by setting the torch adapter's placement of CPU tensors (device 0, a stream made on the fake runtime), so
# everything below the placement is what a CUDA tensor meets: requests on CUDA memory, negotiation of the tensor
# location, the event on the caller's stream, the data plane's stream, fusion buffer and results in "device"
# memory, the completion queue, and NCCL calls (grouped ones for the ragged collectives, PreMulSum for scaling).
# Results are checked against hvdjob's references; then the errors a CUDA tensor can meet, on every rank.
import ctypes
import os

import torch
from hvdjob import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    SHAPES,
    CheckFailure,
    check,
    even_rows,
    expect_raises,
    make,
    parse_build_info,
    reduce_reference,
    value_range,
)

import hvdlite.torch as hvd
from hvdlite.common import ops
from hvdlite.torch import core_ops

hvd.init()
n, me = hvd.size(), hvd.rank()
info = parse_build_info(hvd.build_info())
if not (hvd.nccl_built() and hvd.cuda_built() and hvd.gpu_available("torch")) or info.get("nccl_version") != "21805":
    raise CheckFailure(f"the fake NCCL should be usable: nccl_built={hvd.nccl_built()} {info}")

cudart = ctypes.CDLL(os.environ["HVDLITE_CUDART_LIBRARY"])
stream = ctypes.c_void_p()
assert cudart.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) == 0
host_placement = core_ops.cpu_placement
# NCCL, or STAGED where the ranks share a fake GPU or HVDLITE_GPU_OPERATIONS=host: the same results either way.
plane = os.environ.get("EXPECT_PLANE", "NCCL")


def on_fake_device(device=0):
    core_ops.cpu_placement = (device, stream.value)


on_fake_device()
count = 0

# allreduce: every dtype NCCL reduces, every op, out of place and in place.
REDUCIBLE = [d for d in ALL_DTYPES if d not in (torch.int16,) and d != getattr(torch, "uint16", None)]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
for dtype in REDUCIBLE:
    for op_name, op in OPS.items():
        if dtype == torch.bool and op_name == "Average":
            continue
        lo, hi = value_range(op_name, dtype)
        for shape_name in ("zero", "one", "odd2d", "large"):
            shape = SHAPES[shape_name]
            key = ("allreduce", op_name, shape_name)
            inputs = [make(r, key, shape, dtype, lo, hi) for r in range(n)]
            expected = reduce_reference(inputs, op_name, dtype)
            exact = dtype not in FLOAT_DTYPES or op_name in ("Min", "Max")
            name = f"ar.{dtype}.{op_name}.{shape_name}"
            check(name, hvd.allreduce(inputs[me], op=op, name=name), expected, exact=exact)
            work = inputs[me].clone()
            hvd.allreduce_(work, op=op, name=name + ".inplace")
            check(name + " in place", work, expected, exact=exact)
            count += 2

# Scale factors on floats: PreMulSum for sum/average, scaling around min/max/product (negative flips order).
for dtype in FLOAT_DTYPES:
    for op_name, pre, post in (
        ("Sum", 0.5, 3.0),
        ("Average", 2.0, 0.25),
        ("Min", -2.0, 1.5),
        ("Max", 0.5, -1.0),
        ("Product", 0.5, 2.0),
    ):
        lo, hi = value_range(op_name, dtype)
        inputs = [make(r, ("scaled", op_name), (37,), dtype, lo, hi) for r in range(n)]
        expected = reduce_reference(inputs, op_name, dtype, pre, post)
        got = hvd.allreduce(
            inputs[me], op=OPS[op_name], prescale_factor=pre, postscale_factor=post, name=f"scaled.{dtype}.{op_name}"
        )
        check(f"allreduce {op_name} {dtype} pre {pre} post {post}", got, expected, exact=False)
        count += 1

# Fusion: several small tensors in flight at once share the device fusion buffer.
for dtype in (torch.float32, torch.int32, torch.float16):
    shapes = [(5,), (3, 7), (0,), (129,), (1,)]
    inputs = [[make(r, ("fused", i), s, dtype) for i, s in enumerate(shapes)] for r in range(n)]
    got = hvd.grouped_allreduce(inputs[me], op=hvd.Sum, name=f"fused.{dtype}")
    for i in range(len(shapes)):
        check(
            f"fused allreduce {dtype} #{i}",
            got[i],
            reduce_reference([inputs[r][i] for r in range(n)], "Sum", dtype),
            exact=dtype != torch.float16,
        )
    count += 1

# broadcast from every root, in place and not, every dtype (bytes on NCCL).
for dtype in ALL_DTYPES:
    for root in range(n):
        data = make(me, ("bcast", root), (11, 3), dtype)
        expected = make(root, ("bcast", root), (11, 3), dtype)
        check(f"broadcast {dtype} from {root}", hvd.broadcast(data, root, name=f"bc.{dtype}.{root}"), expected)
        hvd.broadcast_(data, root, name=f"bc_.{dtype}.{root}")
        check(f"broadcast_ {dtype} from {root}", data, expected)
        count += 2

# allgather: equal blocks (ncclAllGather) and unequal ones, a rank with none (grouped broadcasts).
for dtype in (torch.float32, torch.int64, torch.uint8, torch.bool):
    for kind, rows_of in (("equal", lambda r: 4), ("ragged", lambda r: (r * 3) % 5)):
        inputs = [make(r, ("gather", kind), (rows_of(r), 6), dtype) for r in range(n)]
        got = hvd.allgather(inputs[me], name=f"ag.{dtype}.{kind}")
        check(f"allgather {kind} {dtype}", got, torch.cat(inputs))
        count += 1

# alltoall: even split and ragged splits with empty ones (sends and receives in a group).
for dtype in (torch.float64, torch.int32):
    for kind in ("even", "ragged"):

        def splits_of(src):
            return [2] * n if kind == "even" else [(src + 2 * dst) % 3 for dst in range(n)]

        inputs = [make(r, ("a2a", kind), (sum(splits_of(r)), 2), dtype) for r in range(n)]
        splits = splits_of(me)
        out, received = hvd.alltoall(inputs[me], splits=splits, name=f"a2a.{dtype}.{kind}")
        pieces = []
        for src in range(n):
            offset = sum(splits_of(src)[:me])
            pieces.append(inputs[src][offset : offset + splits_of(src)[me]])
        check(f"alltoall {kind} {dtype}", out, torch.cat(pieces))
        check(
            f"alltoall {kind} received splits",
            received,
            torch.tensor([splits_of(s)[me] for s in range(n)], dtype=torch.int32),
        )
        count += 1

# reducescatter: segments of equal size (ncclReduceScatter) and unequal ones (grouped reduces).
for dtype in (torch.float32, torch.int32):
    for rows in (2 * n, 2 * n + 1):
        for op_name in ("Sum", "Average", "Max"):
            if dtype == torch.int32 and op_name == "Average":
                continue
            inputs = [make(r, ("rs", rows, op_name), (rows, 5), dtype) for r in range(n)]
            full = reduce_reference(inputs, op_name, dtype)
            start = sum(even_rows(rows, n)[:me])
            got = hvd.reducescatter(inputs[me], op=OPS[op_name], name=f"rs.{dtype}.{rows}.{op_name}")
            check(
                f"reducescatter {rows} rows {op_name} {dtype}",
                got,
                full[start : start + even_rows(rows, n)[me]],
                exact=dtype != torch.float32 or op_name == "Max",
            )
            count += 1

# A process set of the first and last ranks gets its own NCCL communicator.
if n >= 3:
    subset = hvd.add_process_set([0, n - 1])
    if me in (0, n - 1):
        inputs = [make(r, "subset", (9,), torch.float32) for r in (0, n - 1)]
        got = hvd.allreduce(inputs[0 if me == 0 else 1], op=hvd.Sum, name="subset", process_set=subset)
        check("allreduce on process set [0, n-1]", got, inputs[0] + inputs[1], exact=False)
        count += 1
    hvd.remove_process_set(subset)

# Errors, each on the rank that made it or on every rank, and the process stays usable.
if hasattr(torch, "uint16"):
    expect_raises(
        "uint16 sum on CUDA",
        hvd.InvalidArgumentError,
        hvd.allreduce,
        torch.ones(3, dtype=torch.uint16),
        op=hvd.Sum,
        name="u16",
        match=["NCCL cannot reduce uint16"],
    )
expect_raises(
    "int16 sum on CUDA",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(3, dtype=torch.int16),
    op=hvd.Sum,
    name="i16",
    match=["NCCL cannot reduce int16"],
)
expect_raises(
    "Adasum on CUDA",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(4),
    op=hvd.Adasum,
    name="adasum",
    match=["Adasum runs on host tensors only"],
)
expect_raises(
    "int32 with prescale on CUDA",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(4, dtype=torch.int32),
    op=hvd.Sum,
    prescale_factor=2.0,
    name="iscale",
    match=["floating-point CUDA tensors"],
)
on_fake_device(1)  # the fake runtime has two devices (FAKE_CUDA_DEVICES=2)
expect_raises(
    "a second device",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(2),
    name="dev1",
    match=["device 1", "run on device 0", "one device"],
)
on_fake_device(7)
expect_raises(
    "a device that does not exist",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(2),
    name="dev7",
    match=["device 7", "sees 2 device(s)"],
)
on_fake_device(0)
# Rank 0 submits a host tensor where the others submit CUDA ones: every rank hears who had which.
if me == 0:
    core_ops.cpu_placement = host_placement
error = expect_raises(
    "host on rank 0, CUDA elsewhere",
    hvd.HvdliteError,
    hvd.allreduce,
    torch.ones(3),
    name="where",
    match=["Mismatched tensor locations", "rank 0: host memory", "CUDA memory"],
)
on_fake_device()
check(
    "allreduce after the errors",
    hvd.allreduce(torch.full((3,), float(me)), op=hvd.Sum, name="after"),
    torch.full((3,), float(sum(range(n)))),
    exact=False,
)
count += 1

# Host tensors still take the host path in the same job.
core_ops.cpu_placement = host_placement
check(
    "host allreduce beside CUDA ones",
    hvd.allreduce(torch.ones(5), op=hvd.Sum, name="host"),
    torch.full((5,), float(n)),
)
# A name reduced on the host and then on the "device": the C calls, which serve host tensors, leave it to the
# Python path, which prepares it anew for the device.
for _ in range(2):
    hvd.synchronize(hvd.allreduce_async_(torch.ones(4), op=hvd.Sum, name="moved"))
on_fake_device()
before = ops.fast_calls.taken() if ops.fast_calls else None
moved = hvd.synchronize(hvd.allreduce_async_(torch.ones(4), op=hvd.Sum, name="moved"))
check("a host name reduced on the device", moved, torch.full((4,), float(n)))
if before is not None and ops.fast_calls.taken()[1] != before[1]:
    raise CheckFailure("the C submission took a device tensor's call with its host request")
count += 1

# The timeline's execution span of a CUDA collective runs until the device is done (the completion queue ends it).
from hvdlite.timeline import activities, load  # noqa: E402
from hvdlite.timeline import check as check_trace  # noqa: E402

trace_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"hvdlite-nccl-timeline-{os.getpid()}.json")
hvd.start_timeline(trace_path)  # rank 0 writes it
hvd.allreduce(torch.ones(6), op=hvd.Sum, name="tl.single")
handles = [hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name=f"tl.fused.{i}") for i in range(3)]
for h in handles:
    hvd.synchronize(h)
hvd.stop_timeline()
if me == 0:
    events = load(trace_path)
    os.remove(trace_path)
    problems = check_trace(events)
    spans = activities(events, f"{plane}_ALLREDUCE")
    if (
        problems
        or spans.get("tl.single") != {f"{plane}_ALLREDUCE"}
        or not all(f"tl.fused.{i}" in spans for i in range(3))
    ):
        raise CheckFailure(f"timeline of CUDA collectives: problems {problems}, spans {spans}")
count += 1

hvd.barrier()
counters = (ctypes.c_long * 6)()
cudart.fake_cuda_counters(counters)
waits, bad_waits, records = counters[0], counters[1], counters[2]
# Every CUDA collective that reached the data plane waited on its caller's event, never on an unrecorded one.
if bad_waits or waits < count:
    raise CheckFailure(f"stream waits: {waits} for {count} CUDA collectives, {bad_waits} on unrecorded events")
print(
    f"OK {count} CUDA collectives checked on rank {me}, {waits} stream waits, {records} events recorded", flush=True
)
hvd.shutdown()
counters = (ctypes.c_long * 6)()
cudart.fake_cuda_counters(counters)
# After shutdown the data plane's stream and its buffers are gone; only the job's own stream is left.
if counters[3] != 1 or counters[4] != 0 or counters[5] != 0:
    raise CheckFailure(
        f"after shutdown: {counters[3]} streams, {counters[4]} allocations and {counters[5]} page-locked buffers "
        "still alive"
    )
print(f"RELEASED 1 on rank {me}", flush=True)
