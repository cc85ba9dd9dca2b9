"""Horovod behaviours scripts rely on: the default op Average, unnamed operations in flight together,
broadcast_object, process_set= everywhere Horovod takes it, broadcast_parameters by position, DistributedOptimizer's
backward_passes_per_step, op=Sum and gradient_predivide_factor, compression on reducescatter."""

import torch
import torch.nn as nn
from horovod_torch_common import N, R, check, hvd

# Default op is Average, for every allreduce form.
x = torch.full((3,), float(R + 1))
mean = torch.full((3,), sum(r + 1 for r in range(N)) / N)
check("allreduce default", hvd.allreduce(x, name="d.1"), mean)
check("allreduce_async default", hvd.synchronize(hvd.allreduce_async(x, name="d.2")), mean)
y = x.clone()
check("allreduce_ default", hvd.allreduce_(y, name="d.3"), mean)
check("grouped_allreduce default", hvd.grouped_allreduce([x], name="d.4")[0], mean)

# name=None: unnamed operations in flight at once, synchronized out of order, match by submission order.
handles = [hvd.allreduce_async(torch.full((2,), float(R * 10 + i)), op=hvd.Sum) for i in range(5)]
handles.append(hvd.allgather_async(torch.full((1,), float(R))))
handles.append(hvd.grouped_allreduce_async([torch.ones(2), torch.ones(3)], op=hvd.Sum))
results = {h: hvd.synchronize(h) for h in reversed(handles)}
for i, h in enumerate(handles[:5]):
    check(f"unnamed allreduce {i}", results[h], torch.full((2,), float(sum(r * 10 + i for r in range(N)))))
check("unnamed allgather", results[handles[5]], torch.arange(N, dtype=torch.float32))
check("unnamed grouped", results[handles[6]][1], torch.full((3,), float(N)))

# broadcast_object returns root's object on every rank (root gets its own object back).
payload = {"epoch": 4, "ranks": list(range(N))}
got = hvd.broadcast_object(payload if R == 0 else None, root_rank=0)
assert got == payload and (got is payload) == (R == 0)
assert hvd.broadcast_object(R * 7, root_rank=N - 1) == (N - 1) * 7

# process_set= by keyword everywhere Horovod accepts it, on a set that leaves rank 1 out.
ps = hvd.add_process_set([0, 2])
if ps.included():
    me, members = ps.rank(), ps.ranks
    v = torch.full((2,), float(R))
    set_sum = torch.full((2,), float(sum(members)))
    check("allreduce", hvd.allreduce(v, op=hvd.Sum, process_set=ps), set_sum)
    check("allreduce_async", hvd.synchronize(hvd.allreduce_async(v, op=hvd.Sum, process_set=ps)), set_sum)
    check("allreduce_", hvd.allreduce_(v.clone(), op=hvd.Sum, process_set=ps), set_sum)
    check("allreduce_async_", hvd.synchronize(hvd.allreduce_async_(v.clone(), op=hvd.Sum, process_set=ps)), set_sum)
    check("grouped_allreduce", hvd.grouped_allreduce([v], op=hvd.Sum, process_set=ps)[0], set_sum)
    check(
        "grouped_allreduce_async",
        hvd.synchronize(hvd.grouped_allreduce_async([v], op=hvd.Sum, process_set=ps))[0],
        set_sum,
    )
    check("grouped_allreduce_", hvd.grouped_allreduce_([v.clone()], op=hvd.Sum, process_set=ps)[0], set_sum)
    check(
        "grouped_allreduce_async_",
        hvd.synchronize(hvd.grouped_allreduce_async_([v.clone()], op=hvd.Sum, process_set=ps))[0],
        set_sum,
    )
    gathered = torch.tensor([float(r) for r in members])
    check("allgather", hvd.allgather(v[:1], process_set=ps), gathered)
    check("allgather_async", hvd.synchronize(hvd.allgather_async(v[:1], process_set=ps)), gathered)
    check("grouped_allgather", hvd.grouped_allgather([v[:1]], process_set=ps)[0], gathered)
    check(
        "grouped_allgather_async", hvd.synchronize(hvd.grouped_allgather_async([v[:1]], process_set=ps))[0], gathered
    )
    root = torch.full((2,), 2.0)
    check("broadcast", hvd.broadcast(v, 2, process_set=ps), root)
    check("broadcast_async", hvd.synchronize(hvd.broadcast_async(v, 2, process_set=ps)), root)
    check("broadcast_", hvd.broadcast_(v.clone(), 2, process_set=ps), root)
    check("broadcast_async_", hvd.synchronize(hvd.broadcast_async_(v.clone(), 2, process_set=ps)), root)
    check("alltoall", hvd.alltoall(v, process_set=ps), gathered)
    check("alltoall_async", hvd.synchronize(hvd.alltoall_async(v, process_set=ps))[0], gathered)
    check("reducescatter", hvd.reducescatter(v, op=hvd.Sum, process_set=ps), set_sum[:1])
    check("reducescatter_async", hvd.synchronize(hvd.reducescatter_async(v, op=hvd.Sum, process_set=ps)), set_sum[:1])
    check("grouped_reducescatter", hvd.grouped_reducescatter([v], op=hvd.Sum, process_set=ps)[0], set_sum[:1])
    check(
        "grouped_reducescatter_async",
        hvd.synchronize(hvd.grouped_reducescatter_async([v], op=hvd.Sum, process_set=ps))[0],
        set_sum[:1],
    )
    hvd.barrier(process_set=ps)
    assert hvd.broadcast_object("from 2" if R == 2 else None, root_rank=2, process_set=ps) == "from 2"
    assert hvd.allgather_object(R, process_set=ps) == members
    torch.manual_seed(R)
    model = nn.Linear(2, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0, process_set=ps)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (R + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=0, process_set=ps)
    assert opt.param_groups[0]["lr"] == 0.01
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters(), process_set=ps
    )
    before = model.weight.detach().clone()
    model(torch.full((1, 2), float(R))).sum().backward()
    opt.step()
    check("DistributedOptimizer in a set", model.weight.detach(), before - sum(members) / 2.0)
    sync = hvd.SyncBatchNorm(2, process_set=ps)
    sync(torch.full((2, 2), float(R)))
    check("SyncBatchNorm in a set", sync.running_mean, torch.full((2,), 0.1 * sum(members) / 2))
else:
    # Outside the set, Horovod's optimizer reduces nothing: step() applies this rank's own gradient.
    model = nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters(), process_set=ps
    )
    before = model.weight.detach().clone()
    model(torch.full((1, 2), float(R))).sum().backward()
    opt.step()
    check("DistributedOptimizer outside the set", model.weight.detach(), before - float(R))
hvd.barrier()

# broadcast_parameters also takes model.parameters() (unnamed, matched by position).
torch.manual_seed(R)
model = nn.Linear(3, 3)
hvd.broadcast_parameters(list(model.parameters()), root_rank=1)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
torch.manual_seed(1)
rank1 = torch.cat([p.detach().flatten() for p in nn.Linear(3, 3).parameters()])
check("broadcast_parameters(parameters())", flat, rank1)


# DistributedOptimizer: backward_passes_per_step=k accumulates k passes locally, then averages the sum;
# set_backward_passes_per_step changes k; op=Sum sums; gradient_predivide_factor leaves the average unchanged.
def trained(steps, passes, **kwargs):
    torch.manual_seed(0)
    model = nn.Linear(2, 1, bias=False)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=[(f"w.{kwargs}.{passes}", model.weight)],
        **kwargs,
    )
    if passes != 1:
        opt.set_backward_passes_per_step(passes)
    assert opt.backward_passes_per_step == passes
    for step in range(steps):
        opt.zero_grad()
        for p in range(passes):
            model(torch.full((1, 2), float(R + p + step))).sum().backward()
        opt.step()
    return model.weight.detach()


torch.manual_seed(0)
start = nn.Linear(2, 1, bias=False).weight.detach()
grad = lambda r, p, s: torch.full((1, 2), float(r + p + s))
expected = start - 0.1 * sum(grad(r, p, 0) for r in range(N) for p in range(3)) / N
check("backward_passes_per_step=3", trained(1, 3), expected, exact=False)
expected = start - 0.1 * sum(grad(r, 0, 0) for r in range(N))
check("op=Sum", trained(1, 1, op=hvd.Sum), expected, exact=False)
expected = start - 0.1 * sum(grad(r, 0, 0) for r in range(N)) / N
check("gradient_predivide_factor=4", trained(1, 1, gradient_predivide_factor=4.0), expected, exact=False)

# compression= on reducescatter: 1 + 2**-12 is not a float16 value, so the fp16 wire rounds it to 1 (float32
# would keep it), and the result comes back as float32.
z = torch.full((N, 2), 1.0 + 2**-12)
check(
    "fp16 reducescatter",
    hvd.reducescatter(z, op=hvd.Sum, compression=hvd.Compression.fp16, name="rs.fp16"),
    torch.full((1, 2), float(N)),
)
check("plain reducescatter", hvd.reducescatter(z, op=hvd.Sum, name="rs.fp32"), torch.full((1, 2), N * (1.0 + 2**-12)))
