# Job script: CUDA tensors on a real GPU through hvdlite.torch (the NCCL data plane), one GPU per rank. Inputs are
# produced on a side stream that is still busy when the collective is submitted, so a data plane that did not
# wait on the caller's stream would read stale memory. Results are compared with the same collectives on CPU
# tensors (the host data plane, checked by the other suites).
import torch
from hvdjob import CheckFailure, check, even_rows, make, reduce_reference

import hvdlite.torch as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
if not hvd.nccl_built():
    raise CheckFailure(f"NCCL is not usable: {hvd.build_info()}")
torch.cuda.set_device(hvd.local_rank())
device = torch.device("cuda", hvd.local_rank())
count = 0

side = torch.cuda.Stream(device)
with torch.cuda.stream(side):
    # Queue a long kernel chain first so the input is not ready when allreduce is submitted.
    x = torch.full((1 << 22,), float(me + 1), device=device)
    for _ in range(50):
        x = x * 1.0
    got = hvd.allreduce(x, op=hvd.Sum, name="side-stream")
torch.cuda.synchronize()
check(
    "allreduce of a tensor produced on a busy side stream",
    got.cpu(),
    torch.full((1 << 22,), float(sum(range(1, n + 1)))),
    exact=False,
)
count += 1

for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8):
    for op_name, op, pre, post in (
        ("Sum", hvd.Sum, 1.0, 1.0),
        ("Average", hvd.Average, 1.0, 1.0),
        ("Sum", hvd.Sum, 0.5, 4.0),
        ("Min", hvd.Min, 1.0, 1.0),
        ("Max", hvd.Max, 1.0, 1.0),
    ):
        if dtype in (torch.int32, torch.int64, torch.uint8) and (pre != 1.0 or op_name == "Average"):
            continue
        inputs = [make(r, ("gpu", op_name, pre), (1001, 3), dtype, 0, 3) for r in range(n)]
        expected = reduce_reference(inputs, op_name, dtype, pre, post)
        got = hvd.allreduce(
            inputs[me].to(device),
            op=op,
            prescale_factor=pre,
            postscale_factor=post,
            name=f"gpu.{dtype}.{op_name}.{pre}",
        )
        if got.device != device:
            raise CheckFailure(f"allreduce result on {got.device}, expected {device}")
        check(
            f"allreduce {op_name} {dtype} pre {pre} post {post}",
            got.cpu(),
            expected,
            exact=dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64),
        )
        count += 1

# Fused gradients-like tensors, in place.
tensors = [make(me, ("fused", i), (i * 7 + 1,), torch.float32).to(device) for i in range(20)]
expected = [
    reduce_reference([make(r, ("fused", i), (i * 7 + 1,), torch.float32) for r in range(n)], "Average", torch.float32)
    for i in range(20)
]
handles = [hvd.allreduce_async_(t, op=hvd.Average, name=f"fused.{i}") for i, t in enumerate(tensors)]
for i, h in enumerate(handles):
    check(f"fused allreduce_ #{i}", hvd.synchronize(h).cpu(), expected[i], exact=False)
    count += 1

rows = [(r * 3) % 5 + 1 for r in range(n)]
inputs = [make(r, "gather", (rows[r], 4), torch.float32) for r in range(n)]
check("allgather of unequal blocks", hvd.allgather(inputs[me].to(device), name="gather").cpu(), torch.cat(inputs))
data = make(me, "bcast", (33,), torch.int64).to(device)
hvd.broadcast_(data, 0, name="bcast")
check("broadcast_ from 0", data.cpu(), make(0, "bcast", (33,), torch.int64))
splits = [(me + d) % 3 for d in range(n)]
a2a_in = [make(r, "a2a", (sum((r + d) % 3 for d in range(n)), 2), torch.float32) for r in range(n)]
out, received = hvd.alltoall(a2a_in[me].to(device), splits=splits, name="a2a")
pieces = [a2a_in[s][sum((s + d) % 3 for d in range(me)) :][: (s + me) % 3] for s in range(n)]
check("alltoall", out.cpu(), torch.cat(pieces))
rs_rows = 2 * n + 1
rs_in = [make(r, "rs", (rs_rows, 3), torch.float32) for r in range(n)]
full = reduce_reference(rs_in, "Sum", torch.float32)
start = sum(even_rows(rs_rows, n)[:me])
check(
    "reducescatter of unequal segments",
    hvd.reducescatter(rs_in[me].to(device), op=hvd.Sum, name="rs").cpu(),
    full[start : start + even_rows(rs_rows, n)[me]],
    exact=False,
)
count += 4

# A model trained with DistributedOptimizer on the GPU keeps every rank's parameters identical.
torch.manual_seed(me)
model = torch.nn.Linear(16, 4).to(device)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
for step in range(5):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 16, device=device)).pow(2).mean()
    loss.backward()
    optimizer.step()
weights = hvd.allgather(model.weight.detach().reshape(1, -1), name="weights").cpu()
if not all(torch.equal(weights[0], weights[r]) for r in range(n)):
    raise CheckFailure("parameters differ across ranks after DistributedOptimizer steps on the GPU")
count += 1
print(f"OK {count} CUDA collectives on rank {me}", flush=True)
