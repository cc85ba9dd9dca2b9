"""The grouped collectives are differentiable, each member's gradient as its ungrouped collective's."""

import torch
from horovod_torch_common import D, N, R, check, close, hvd, upstream

rows = [r + 1 for r in range(N)]
offset = sum(rows[:R])
xs = [torch.arange(3, dtype=D).add(R).requires_grad_(True), torch.ones(2, 2, dtype=D).mul(R).requires_grad_(True)]
outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="gar")
assert all(o.grad_fn is not None for o in outs) and outs[0].grad_fn is outs[1].grad_fn  # one node per group
sum((o * upstream(R, f"gar.{i}", o.shape)).sum() for i, o in enumerate(outs)).backward()
for i, x in enumerate(xs):
    close(f"grouped_allreduce {i}", x.grad, sum(upstream(r, f"gar.{i}", x.shape) for r in range(N)))

gs = [torch.ones(rows[R], 2, dtype=D, requires_grad=True), torch.ones(rows[R], dtype=D, requires_grad=True)]
outs = hvd.grouped_allgather(gs, name="gag")
assert outs[0].grad_fn is not None and outs[0].grad_fn is outs[1].grad_fn
sum((o * upstream(R, f"gag.{i}", o.shape)).sum() for i, o in enumerate(outs)).backward()
for i, g in enumerate(gs):
    mean = sum(upstream(r, f"gag.{i}", (sum(rows),) + tuple(g.shape[1:])) for r in range(N)) / N
    close(f"grouped_allgather {i}", g.grad, mean[offset : offset + rows[R]])

ss = [torch.ones(2 * N, 3, dtype=D, requires_grad=True), torch.ones(N, dtype=D, requires_grad=True)]
outs = hvd.grouped_reducescatter(ss, op=hvd.Sum, name="grs")
assert outs[0].grad_fn is not None and outs[0].grad_fn is outs[1].grad_fn
sum((o * upstream(R, f"grs.{i}", o.shape)).sum() for i, o in enumerate(outs)).backward()
for i, s in enumerate(ss):
    piece_shape = (s.shape[0] // N,) + tuple(s.shape[1:])
    gathered = torch.cat([upstream(r, f"grs.{i}", piece_shape) for r in range(N)])
    close(f"grouped_reducescatter {i}", s.grad, gathered * N)

# A group where only some tensors need gradients, and without autograd: plain tensors come back.
mixed = [torch.ones(2, dtype=D, requires_grad=True), torch.arange(2, dtype=torch.int32)]
outs = hvd.grouped_allreduce(mixed, op=hvd.Sum, name="mixed")
check("integer member of a differentiable group", outs[1], torch.arange(2, dtype=torch.int32) * N)
outs[0].sum().backward()
close("float member", mixed[0].grad, torch.full((2,), float(N), dtype=D))
with torch.no_grad():
    assert all(o.grad_fn is None for o in hvd.grouped_allreduce(xs, name="nograd"))

# Inside a process set: the average runs over the set's members only.
ps = hvd.add_process_set([0, 2])
if ps.included():
    me, members = ps.rank(), [0, 2]
    a = torch.ones(me + 1, dtype=D, requires_grad=True)
    (hvd.allgather(a, process_set=ps, name="ps.ag") * upstream(R, "ps.ag", (3,))).sum().backward()
    mean = sum(upstream(r, "ps.ag", (3,)) for r in members) / 2
    close("allgather in a process set", a.grad, mean[me : 2 * me + 1])
hvd.barrier()  # rank 1 must not shut down while the set's members are still at work
