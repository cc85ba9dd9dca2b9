# Job script: CUDA tensors on a real GPU through hvdlite.torch. EXPECT_PLANE says which data plane the job's CUDA
# collectives must take: NCCL (a GPU per rank) or STAGED (ranks share a GPU: device -> page-locked host memory ->
# the host data plane -> device); the timeline shows which one ran. Every collective, on the dtypes NCCL reduces,
# is compared with torch computing the same result on the device from every rank's input (hvdjob.make rebuilds
# them); then the ordering against the caller's stream, and a small CNN trained against a one-process reference.
import os
import time

import torch
from hvdjob import (
    FLOAT_DTYPES,
    CheckFailure,
    check,
    even_rows,
    expect_raises,
    make,
    reduce_reference,
    value_range,
)

import hvdlite.torch as hvd
from hvdlite.timeline import activities, load

hvd.init()
n, me = hvd.size(), hvd.rank()
plane = os.environ["EXPECT_PLANE"]
if not hvd.nccl_built():
    raise CheckFailure(f"NCCL is not usable: {hvd.build_info()}")
# GPU_JOB_ON_FAKE_CUDA=1 checks this script's own logic without a GPU, on tests/fake_cuda: CPU tensors are placed
# "on the device" as in nccl_fake.py, and the parts that need real streams are left out.
fake = os.environ.get("GPU_JOB_ON_FAKE_CUDA") == "1"
if fake:
    import ctypes

    from hvdlite.torch import core_ops

    fake_stream = ctypes.c_void_p()
    ctypes.CDLL(os.environ["HVDLITE_CUDART_LIBRARY"]).cudaStreamCreateWithFlags(ctypes.byref(fake_stream), 1)
    core_ops.cpu_placement = (0, fake_stream.value)
    device = torch.device("cpu")
else:
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
count = 0

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64)
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}


def every_rank(key, shape, dtype, lo=-3, hi=3):
    """Each rank's input for this case, on the device."""
    return [make(r, key, shape, dtype, lo, hi).to(device) for r in range(n)]


def on_device(what, tensor):
    if tensor.device != device:
        raise CheckFailure(f"{what}: result on {tensor.device}, expected {device}")
    return tensor


# allreduce: every op, out of place and in place; scale factors on floats (PreMulSum on NCCL, host scaling staged).
for dtype in DTYPES:
    for op_name, op in OPS.items():
        lo, hi = value_range(op_name, dtype)
        xs = every_rank(("ar", op_name), (1001, 3), dtype, lo, hi)
        expected = reduce_reference(xs, op_name, dtype)
        exact = dtype not in FLOAT_DTYPES or op_name in ("Min", "Max")
        name = f"ar.{dtype}.{op_name}"
        check(name, on_device(name, hvd.allreduce(xs[me], op=op, name=name)), expected, exact=exact)
        work = xs[me].clone()
        hvd.allreduce_(work, op=op, name=name + ".inplace")
        check(name + " in place", work, expected, exact=exact)
        count += 2
    if dtype in FLOAT_DTYPES:
        for op_name, pre, post in (("Sum", 0.5, 4.0), ("Average", 2.0, 0.25), ("Max", -1.0, 2.0)):
            xs = every_rank(("scaled", op_name), (257,), dtype)
            expected = reduce_reference(xs, op_name, dtype, pre, post)
            name = f"scaled.{dtype}.{op_name}"
            got = hvd.allreduce(xs[me], op=OPS[op_name], prescale_factor=pre, postscale_factor=post, name=name)
            check(f"{name} pre {pre} post {post}", got, expected, exact=False)
            count += 1

# Grouped and concurrently submitted allreduces fuse into one buffer on the device (NCCL) or in host memory
# (staged); the timeline names the plane and the fusion.
trace = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"hvdlite-gpu-timeline-{os.getpid()}.json")
hvd.start_timeline(trace)
for dtype in (torch.float32, torch.bfloat16, torch.int64):
    shapes = [(i * 7 + 1,) for i in range(20)]
    xs = [every_rank(("grouped", i), s, dtype) for i, s in enumerate(shapes)]
    got = hvd.grouped_allreduce([x[me] for x in xs], op=hvd.Sum, name=f"grouped.{dtype}")
    for i in range(len(shapes)):
        check(f"grouped allreduce {dtype} #{i}", got[i], reduce_reference(xs[i], "Sum", dtype), exact=False)
    count += 1
grads = [every_rank(("fused", i), (i * 13 + 5,), torch.float32) for i in range(20)]
handles = [hvd.allreduce_async_(g[me].clone(), op=hvd.Average, name=f"fused.{i}") for i, g in enumerate(grads)]
for i, h in enumerate(handles):
    check(f"fused allreduce_ #{i}", hvd.synchronize(h), reduce_reference(grads[i], "Average", torch.float32), False)
    count += 1
hvd.stop_timeline()
if me == 0:
    events = load(trace)
    os.remove(trace)
    spans = activities(events, f"{plane}_ALLREDUCE")
    fused = {a for names in spans.values() for a in names if "fused x" in a}
    if not spans or not fused or activities(events, "NCCL_" if plane == "STAGED" else "STAGED_"):
        raise CheckFailure(f"timeline: expected fused {plane}_ALLREDUCE spans only, got {spans}")
    print(f"TIMELINE {len(spans)} {plane} allreduce spans, fused as {sorted(fused)[:3]}", flush=True)

# allgather of equal blocks and of unequal ones (a rank may have none), every dtype.
for dtype in DTYPES:
    for kind, rows_of in (("equal", lambda r: 4), ("ragged", lambda r: (r * 3) % 5)):
        xs = [make(r, ("gather", kind), (rows_of(r), 6), dtype).to(device) for r in range(n)]
        name = f"ag.{dtype}.{kind}"
        check(name, on_device(name, hvd.allgather(xs[me], name=name)), torch.cat(xs))
        count += 1

# broadcast from every root, in place and not.
for dtype in DTYPES:
    for root in range(n):
        data = make(me, ("bcast", root), (11, 3), dtype).to(device)
        expected = make(root, ("bcast", root), (11, 3), dtype).to(device)
        check(f"broadcast {dtype} from {root}", hvd.broadcast(data, root, name=f"bc.{dtype}.{root}"), expected)
        hvd.broadcast_(data, root, name=f"bc_.{dtype}.{root}")
        check(f"broadcast_ {dtype} from {root}", data, expected)
        count += 2

# alltoall with an even split and with ragged splits, some empty (alltoallv).
for dtype in DTYPES:
    for kind in ("even", "ragged"):

        def splits_of(src, kind=kind):
            return [2] * n if kind == "even" else [(src + 2 * dst) % 3 for dst in range(n)]

        xs = [make(r, ("a2a", kind), (sum(splits_of(r)), 2), dtype).to(device) for r in range(n)]
        out, received = hvd.alltoall(xs[me], splits=splits_of(me), name=f"a2a.{dtype}.{kind}")
        pieces = [xs[s][sum(splits_of(s)[:me]) :][: splits_of(s)[me]] for s in range(n)]
        check(f"alltoall {kind} {dtype}", on_device("alltoall", out), torch.cat(pieces))
        check(
            f"alltoall {kind} received splits",
            received.cpu(),
            torch.tensor([splits_of(s)[me] for s in range(n)], dtype=torch.int32),
        )
        count += 1

# reducescatter over equal and unequal segments.
for dtype in DTYPES:
    for rows in (2 * n, 2 * n + 1):
        for op_name in ("Sum", "Average", "Max"):
            xs = every_rank(("rs", rows, op_name), (rows, 5), dtype)
            full = reduce_reference(xs, op_name, dtype)
            start = sum(even_rows(rows, n)[:me])
            got = hvd.reducescatter(xs[me], op=OPS[op_name], name=f"rs.{dtype}.{rows}.{op_name}")
            check(
                f"reducescatter {rows} rows {op_name} {dtype}",
                on_device("reducescatter", got),
                full[start : start + even_rows(rows, n)[me]],
                exact=dtype not in FLOAT_DTYPES or op_name == "Max",
            )
            count += 1

# Errors on CUDA tensors name the tensor, on every rank, and the job goes on.
expect_raises(
    "Adasum on CUDA",
    hvd.InvalidArgumentError,
    hvd.allreduce,
    torch.ones(4, device=device),
    op=hvd.Adasum,
    name="adasum",
    match=["Adasum runs on host tensors only"],
)
count += 1


def spin_cycles(seconds):
    """GPU clock cycles that torch.cuda._sleep spins for about `seconds` (measured: the clock varies)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * seconds * 1000.0 / start.elapsed_time(end))


# Stream ordering needs real streams (not on the fake CUDA).
if not fake:
    # The caller's stream orders the input: it is produced behind a 0.3 s spin, so a data plane that did not wait on
    # the stream would read stale memory; submitting must not wait for it either.
    cycles = spin_cycles(0.3)
    x = torch.zeros(1 << 20, device=device)
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    x.fill_(float(me + 1))
    began = time.perf_counter()
    handle = hvd.allreduce_async(x, op=hvd.Sum, name="behind-a-spin")
    submitted = time.perf_counter() - began
    check(
        "allreduce of an input produced behind a spin",
        hvd.synchronize(handle),
        torch.full((1 << 20,), float(n * (n + 1) // 2), device=device),
        exact=False,
    )
    if submitted > 0.1:
        raise CheckFailure(f"allreduce_async took {submitted:.3f} s to submit: it waited for the caller's stream")
    count += 1

    # The collective never blocks the caller's stream: while it waits for a late rank, a kernel queued behind the
    # submission on the same stream runs to completion.
    if n > 1:
        a = torch.randn(2048, 2048, device=device)
        torch.cuda.synchronize()
        hvd.barrier()
        if me == 1:
            time.sleep(1.0)
        x = torch.full((1 << 20,), float(me + 1), device=device)
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="late-peer")
        if me == 0:
            began = time.perf_counter()
            for _ in range(5):
                a = (a @ a).tanh()
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
            ran = time.perf_counter() - began
            pending = not hvd.poll(handle)
            if ran > 0.5 or not pending:
                raise CheckFailure(
                    f"a kernel behind a pending collective took {ran:.3f} s (collective pending: "
                    f"{pending}); the caller's stream waited for the collective"
                )
            print(f"STREAM kernel behind a pending collective finished in {ran * 1000:.1f} ms", flush=True)
        check(
            "allreduce with a late peer",
            hvd.synchronize(handle),
            torch.full((1 << 20,), float(n * (n + 1) // 2), device=device),
            exact=False,
        )
        count += 1

# A small CNN trained with DistributedOptimizer, each rank on its shard of the batch, against the same model trained
# in this process on the whole batch without hvdlite: the same losses and parameters within float tolerance.
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def cnn():
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    ).to(device)


generator = torch.Generator().manual_seed(99)
images = torch.randn(12, 32, 1, 16, 16, generator=generator).to(device)
labels = (images.flatten(2).sum(-1) > 0).long()  # learnable: the sign of an image's sum
reference, model = cnn(), cnn()
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
shard = slice(me * 32 // n, (me + 1) * 32 // n)
losses = []
for step in range(12):
    ref_opt.zero_grad()
    ref_loss = torch.nn.functional.cross_entropy(reference(images[step]), labels[step])
    ref_loss.backward()
    ref_opt.step()
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(images[step][shard]), labels[step][shard])
    loss.backward()
    opt.step()
    mean_loss = hvd.allreduce(loss.detach(), op=hvd.Average, name=f"loss.{step}")
    losses.append((ref_loss.item(), mean_loss.item()))
    if abs(ref_loss.item() - mean_loss.item()) > 1e-4 * (1 + abs(ref_loss.item())):
        raise CheckFailure(
            f"training step {step}: loss {mean_loss.item()!r}, one-process reference {ref_loss.item()!r}"
        )
for (name, p), q in zip(model.named_parameters(), reference.parameters()):
    if not torch.allclose(p, q, rtol=1e-3, atol=1e-5):
        raise CheckFailure(
            f"after training, parameter {name} differs from the reference by {(p - q).abs().max().item():.3g}"
        )
print(f"TRAINED 12 steps, loss {losses[0][1]:.4f} -> {losses[-1][1]:.4f} (reference {losses[-1][0]:.4f})", flush=True)
count += 1
print(f"OK {count} CUDA checks on rank {me}, plane {plane}", flush=True)
