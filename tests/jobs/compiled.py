"""hvdlite under torch.compile (aot_eager and inductor): collectives inside a compiled function are graph nodes
(no graph break) and give eager mode's results and gradients; a compiled model trains through DistributedOptimizer
to the weights one eager process reaches on the global batch."""

import sys

import torch
import torch.nn as nn

import hvdlite.torch as hvd

# hvdlite.torch leaves torch._dynamo unimported (a second at import): what makes its C allreduce_ traceable is
# registered when the program imports it, as torch.compile does.
assert "torch._dynamo" not in sys.modules
import torch._dynamo  # noqa: E402

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()
BACKENDS = ("aot_eager", "inductor")


def collectives(x):
    y = hvd.allreduce(x * 2, name="compiled.sum", op=hvd.Sum)
    averaged = hvd.allreduce(y)  # unnamed: the core numbers it in each rank's order
    root = hvd.broadcast(averaged + rank, root_rank=size - 1, name="compiled.broadcast")
    inplace = root.clone()
    hvd.allreduce_(inplace, name="compiled.inplace", op=hvd.Max)
    hvd.broadcast_(inplace, 0, name="compiled.broadcast_")
    pair = hvd.grouped_allreduce([inplace, inplace * 3], name="compiled.group", op=hvd.Sum)
    return y + 1, averaged, root, inplace, pair[0], pair[1]


def gathered(x):
    return hvd.allgather(x * (rank + 1), name="compiled.gather") + 1


def differentiable(x):
    return (
        hvd.allreduce(x * (rank + 1), name="compiled.grad").sum() + hvd.broadcast(x * 3, 0, name="compiled.b").sum()
    )


x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + rank
explained = torch._dynamo.explain(collectives)(x)
assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
eager = collectives(x)
eager_gathered = gathered(torch.ones(rank + 1, 2))  # the ranks' row counts differ
x_eager = torch.ones(4, requires_grad=True)
differentiable(x_eager).backward()
for backend in BACKENDS:
    torch._dynamo.reset()
    got = torch.compile(collectives, backend=backend, fullgraph=True)(x)
    assert all(torch.equal(a, b) for a, b in zip(got, eager)), (backend, got, eager)
    # allgather's row count is known only when it runs: it stays in the graph with fullgraph=True
    got = torch.compile(gathered, backend=backend, fullgraph=True)(torch.ones(rank + 1, 2))
    assert torch.equal(got, eager_gathered) and got.shape[0] == size * (size + 1) // 2, (backend, got.shape)
    x_compiled = torch.ones(4, requires_grad=True)
    torch.compile(differentiable, backend=backend, fullgraph=True)(x_compiled).backward()
    assert torch.equal(x_compiled.grad, x_eager.grad), (backend, x_compiled.grad, x_eager.grad)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


def batch(step, r):
    g = torch.Generator().manual_seed(100 * step + r)
    return torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)


for backend in BACKENDS:
    torch._dynamo.reset()
    net, ref = model(), model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), named_parameters=net.named_parameters()
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    compiled = torch.compile(net, backend=backend)
    assert torch._dynamo.explain(net)(batch(0, rank)[0]).graph_break_count == 0
    for step in range(4):
        x, y = batch(step, rank)
        opt.zero_grad()
        (compiled(x) - y).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum((ref(bx) - by).pow(2).mean() for bx, by in (batch(step, r) for r in range(size))) / size).backward()
        ref_opt.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-5), (backend, (p - q).abs().max())
    flat = torch.cat([p.detach().flatten() for p in net.parameters()]).unsqueeze(0)
    assert all(torch.equal(w, flat[0]) for w in hvd.allgather(flat, name=f"weights.{backend}")), backend
