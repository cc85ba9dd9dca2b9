"""hvdlite.torch behaves as horovod.torch where scripts can tell, across real processes: alltoall's return
forms, the gradients of (grouped) differentiable collectives, sparse gradients and sparse_allreduce_async,
broadcast_optimizer_state with parameters that never had a gradient, DistributedOptimizer's warnings and usage
errors, and behaviour pins (default op, unnamed ops, process_set everywhere, broadcast_object, gradient
accumulation, op=Sum and gradient_predivide_factor). Horovod's reference behaviour is quoted where it is
checked.
"""

import pytest
from hvdjob import prelude
from multiproc import run_checked

COMMON = (
    prelude()
    + """
import warnings, zlib
import torch, torch.nn as nn, torch.nn.functional as F
import hvdlite.torch as hvd
from hvdjob import check, expect_raises
hvd.init()
torch.set_num_threads(1)
R, N = hvd.rank(), hvd.size()
D = torch.float64

def upstream(r, key, shape):
    # Rank r's gradient flowing into a collective's output: different on every rank, so averaging and
    # summing over the ranks give different results.
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{r}".encode()))
    return torch.randn(shape, generator=g, dtype=D)

def close(what, got, expected, atol=1e-12):
    assert got is not None, f"{what}: no gradient"
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=atol), \\
        f"{what} on rank {R}: got {got}, expected {expected}"
"""
)


def run(script, np=2, timeout=150):
    return run_checked(COMMON + script, np, timeout=timeout)


@pytest.mark.timeout(200)
def test_alltoall_returns_the_tensor_unless_splits_are_given():
    run(
        """
x = torch.arange(3 * N * 2, dtype=torch.float32).reshape(3 * N, 2) + 100 * R
everyone = [torch.arange(3 * N * 2, dtype=torch.float32).reshape(3 * N, 2) + 100 * r for r in range(N)]
expected = torch.cat([e[3 * R:3 * R + 3] for e in everyone])
out = hvd.alltoall(x, name="even")                       # Horovod: the tensor alone without splits
assert isinstance(out, torch.Tensor), type(out)
check("alltoall without splits", out, expected)
out, received = hvd.alltoall(x, splits=[3] * N, name="listed")   # ... and (tensor, received splits) with them
check("alltoall with splits", out, expected)
check("received splits (list given: int32)", received, torch.full((N,), 3, dtype=torch.int32))
out, received = hvd.alltoall(x, splits=torch.full((N,), 3, dtype=torch.int64), name="tensor")
check("received splits keep the splits tensor's dtype", received, torch.full((N,), 3, dtype=torch.int64))
# Horovod's synchronize() on an alltoall_async handle returns (output, received_splits) in both cases.
out, received = hvd.synchronize(hvd.alltoall_async(x, name="async"))
check("alltoall_async output", out, expected)
check("alltoall_async received splits", received, torch.full((N,), 3, dtype=torch.int32))
# The differentiable path has the same return forms.
xg = x.double().requires_grad_(True)
out = hvd.alltoall(xg, name="grad.even")
assert isinstance(out, torch.Tensor) and out.grad_fn is not None
out.sum().backward()
check("alltoall gradient", xg.grad, torch.ones_like(xg))
out, received = hvd.alltoall(xg, splits=[3] * N, name="grad.split")
assert out.grad_fn is not None and not received.requires_grad
print("DONE")
""",
        np=3,
    )


@pytest.mark.timeout(200)
def test_collective_gradients_follow_horovod():
    run(
        """
rows = [r + 1 for r in range(N)]          # ragged first dimensions
offset = sum(rows[:R])

# allreduce: allreduce of the gradient with the forward's op and scale factors
for op, name in ((hvd.Sum, "sum"), (hvd.Average, "avg")):
    x = torch.arange(4, dtype=D).add(R).requires_grad_(True)
    (hvd.allreduce(x, op=op, prescale_factor=2.0, postscale_factor=0.25, name=f"ar.{name}")
     * upstream(R, f"ar.{name}", (4,))).sum().backward()
    total = sum(upstream(r, f"ar.{name}", (4,)) for r in range(N))
    close(f"allreduce {name}", x.grad, 0.5 * (total if op == hvd.Sum else total / N))

# allgather: the gradient is AVERAGED over the ranks, then this rank's rows are taken
# (torch.distributed.nn.functional.all_gather would sum it)
a = torch.ones(rows[R], 2, dtype=D, requires_grad=True)
(hvd.allgather(a, name="ag") * upstream(R, "ag", (sum(rows), 2))).sum().backward()
mean = sum(upstream(r, "ag", (sum(rows), 2)) for r in range(N)) / N
close("allgather", a.grad, mean[offset:offset + rows[R]])

# broadcast: the gradient is AVERAGED over the ranks on the root, zero elsewhere
b = torch.ones(3, dtype=D, requires_grad=True)
(hvd.broadcast(b, root_rank=1, name="bc") * upstream(R, "bc", (3,))).sum().backward()
mean = sum(upstream(r, "bc", (3,)) for r in range(N)) / N
close("broadcast", b.grad, mean if R == 1 else torch.zeros(3, dtype=D))

# alltoall: the gradient goes back along the received splits, unscaled
splits = [[(r + j) % 2 + 1 for j in range(N)] for r in range(N)]      # splits[r][j]: rows r sends to j
received_rows = [sum(splits[r][j] for r in range(N)) for j in range(N)]
t = torch.ones(sum(splits[R]), 2, dtype=D, requires_grad=True)
out, _ = hvd.alltoall(t, splits=splits[R], name="a2a")
(out * upstream(R, "a2a", (received_rows[R], 2))).sum().backward()
pieces = []
for j in range(N):
    start = sum(splits[i][j] for i in range(R))    # where rank R's rows sit in rank j's output
    pieces.append(upstream(j, "a2a", (received_rows[j], 2))[start:start + splits[R][j]])
close("alltoall", t.grad, torch.cat(pieces))

# reducescatter: allgather of the gradient, times the set size for Sum, times prescale * postscale
total_rows = 2 * N + 1                     # uneven: rank 0 gets the extra row
mine = [total_rows // N + (1 if r < total_rows % N else 0) for r in range(N)]
for op, name in ((hvd.Sum, "sum"), (hvd.Average, "avg")):
    s = torch.ones(total_rows, 2, dtype=D, requires_grad=True)
    piece = hvd.reducescatter(s, op=op, prescale_factor=3.0, name=f"rs.{name}")
    (piece * upstream(R, f"rs.{name}", (mine[R], 2))).sum().backward()
    gathered = torch.cat([upstream(r, f"rs.{name}", (mine[r], 2)) for r in range(N)])
    close(f"reducescatter {name}", s.grad, gathered * 3.0 * (N if op == hvd.Sum else 1))
print("DONE")
""",
        np=3,
    )


@pytest.mark.timeout(200)
def test_grouped_collectives_are_differentiable():
    run(
        """
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
    close(f"grouped_allgather {i}", g.grad, mean[offset:offset + rows[R]])

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
    close("allgather in a process set", a.grad, mean[me:2 * me + 1])
hvd.barrier()  # rank 1 must not shut down while the set's members are still at work
print("DONE")
""",
        np=3,
    )


@pytest.mark.timeout(200)
def test_sparse_gradients_reach_sparse_adam_sparse():
    run("""
for as_dense in (False, True):
    torch.manual_seed(0)
    emb, ref = nn.Embedding(12, 3, sparse=True), nn.Embedding(12, 3, sparse=True)
    ref.load_state_dict(emb.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.05),
                                   named_parameters=[(f"emb.{as_dense}", emb.weight)], sparse_as_dense=as_dense)
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
    for step in range(4):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 12, (N, 5), generator=g)
        opt.zero_grad()
        emb(ids[R]).pow(2).sum().backward()
        opt.synchronize()
        assert emb.weight.grad.is_sparse, f"sparse_as_dense={as_dense}: the optimizer would get a dense gradient"
        with opt.skip_synchronize():
            opt.step()            # SparseAdam raises on a dense gradient
        ref_opt.zero_grad()
        (sum(ref(ids[r]).pow(2).sum() for r in range(N)) / N).backward()   # the mean of the ranks' losses
        ref_opt.step()
    assert torch.allclose(emb.weight, ref.weight, atol=1e-6), (as_dense, (emb.weight - ref.weight).abs().max())

# sparse_allreduce_async: Horovod's signature; the handle is callable (as Horovod's optimizer uses it) and
# synchronize() also accepts it.
dense = [torch.zeros(6, 2, dtype=D) for _ in range(N)]
for r in range(N):
    dense[r][r] = 1.0 + r
    dense[r][4] = 10.0 * (r + 1)          # an index every rank has
mine = dense[R].to_sparse(1)
for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / N)):
    handle = hvd.sparse_allreduce_async(mine, f"sp.{op}", op)
    result = handle()
    assert result.is_sparse and hvd.synchronize(handle) is result
    assert hvd.poll(handle)
    check(f"sparse_allreduce_async op={op}", result.to_dense(), sum(dense) * scale)
solo = hvd.add_process_set([1])
if solo.included():
    result = hvd.synchronize(hvd.sparse_allreduce_async(mine, "sp.solo", hvd.Average, process_set=solo))
    check("sparse_allreduce_async in a process set", result.to_dense(), dense[R])
hvd.barrier()
expect_raises("dense input", ValueError, hvd.sparse_allreduce_async, dense[R], "sp.dense", hvd.Sum,
              match=["sparse"])
print("DONE")
""")


@pytest.mark.timeout(200)
def test_broadcast_optimizer_state_with_parameters_that_never_had_a_gradient():
    run("""
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.used, self.never = nn.Linear(4, 3), nn.Linear(4, 3)   # `never` gets no gradient, ever
    def forward(self, x, extra=False):
        return self.used(x) + (self.never(x) if extra else 0)

def digest(opt):
    state = opt.state_dict()
    return {k: {n: (v.tolist() if torch.is_tensor(v) else v) for n, v in s.items()}
            for k, s in state["state"].items()}, state["param_groups"][0]["lr"]

def batch(step):
    g = torch.Generator().manual_seed(50 + step)
    return torch.randn(N * 2, 4, generator=g)

makers = {"sgd-momentum": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9),
          "adam": lambda ps, lr: torch.optim.Adam(ps, lr=lr)}
for kind, make in makers.items():
    # 1. Root trained alone on `used`; rank 1 trained both layers with another lr: after the broadcast every
    #    rank has root's state exactly (none for `never`) and root's hyper-parameters.
    model = Net()
    opt = make(model.parameters(), 0.1 if R == 0 else 0.7)
    for step in range(2):
        opt.zero_grad()
        model(torch.randn(2, 4), extra=(R != 0)).sum().backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    mine = digest(opt)
    assert hvd.allgather_object(mine, name=f"digest.{kind}") == [mine] * N, f"{kind}: states differ"
    assert set(mine[0]) == {0, 1} and mine[1] == 0.1, (kind, mine[0].keys(), mine[1])

    # 2. The usual Horovod script order with fresh optimizers (no state anywhere), then training where
    #    `never` still gets no gradient: it matches one process training on the global batch.
    model, ref = Net(), Net()
    opt = hvd.DistributedOptimizer(make(model.parameters(), 0.05), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    # as after Horovod's call (its dummy step), every parameter has a gradient, zero
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters()), kind
    ref_opt = make(ref.parameters(), 0.05)
    for step in range(3):
        x = batch(step)
        opt.zero_grad()
        model(x[R * 2:(R + 1) * 2]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(ref(x[r * 2:(r + 1) * 2]).pow(2).mean() for r in range(N)) / N).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (kind, name, (p - q).abs().max())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert all(torch.equal(f, flat) for f in hvd.allgather(flat.unsqueeze(0), name=f"flat.{kind}"))

lbfgs = torch.optim.LBFGS(Net().parameters())
expect_raises("LBFGS", ValueError, hvd.broadcast_optimizer_state, lbfgs, 0,
              match=["cannot broadcast torch.optim.LBFGS state"])
print("DONE")
""")


@pytest.mark.timeout(200)
def test_distributed_optimizer_warnings_and_usage_errors_match_horovod():
    run("""
def model_and_opt(**kwargs):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    return model, hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters(), **kwargs)

STEP_WARNING = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
                "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")
model, opt = model_and_opt()
model(torch.ones(1, 3)).sum().backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.step()
assert [(w.category, str(w.message)) for w in caught] == [(UserWarning, STEP_WARNING)], caught
opt.zero_grad()
model(torch.ones(1, 3)).sum().backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
assert not caught, [str(w.message) for w in caught]

# zero_grad() with reductions in flight, or part way through accumulating backward_passes_per_step passes
model(torch.ones(1, 3)).sum().backward()
ZERO_GRAD = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
             "optimizer.synchronize(). This is prohibited as it can cause a race condition.")
e = expect_raises("zero_grad in flight", AssertionError, opt.zero_grad)
assert str(e) == ZERO_GRAD, str(e)
opt.step()
opt.zero_grad()
model, opt = model_and_opt(backward_passes_per_step=2)
model(torch.ones(1, 3)).sum().backward()
expect_raises("zero_grad mid accumulation", AssertionError, opt.zero_grad, match=["zero_grad() was called"])
model(torch.ones(1, 3)).sum().backward()
e = expect_raises("a third pass", AssertionError, lambda: model(torch.ones(1, 3)).sum().backward())
assert str(e) == ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                  "Increase backward_passes_per_step to accumulate gradients locally."), str(e)
opt.step()

e = expect_raises("predivide with Sum", ValueError, model_and_opt, op=hvd.Sum, gradient_predivide_factor=2.0)
assert str(e) == "gradient_predivide_factor not supported with op != Average", str(e)
expect_raises("groups=-1", ValueError, model_and_opt, groups=-1,
              match=["groups should be a non-negative integer or a list of list of torch.Tensor."])
model = nn.Linear(3, 2)
expect_raises("a parameter twice", ValueError, hvd.DistributedOptimizer, torch.optim.SGD(model.parameters(), lr=1),
              named_parameters=model.named_parameters(), groups=[[model.weight], [model.weight]],
              match=["A parameter can only appear once in groups."])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model, opt = model_and_opt(num_groups=1)       # Horovod's deprecated spelling of groups=1
assert [w.category for w in caught] == [DeprecationWarning] and "num_groups" in str(caught[0].message)
model(torch.ones(1, 3)).sum().backward()
opt.step()

# The deprecated average= argument: Horovod's warning and error
x = torch.ones(2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    check("average=False sums", hvd.allreduce(x, average=False, name="avg.false"), x * N)
assert [(w.category, str(w.message)) for w in caught] == \\
    [(DeprecationWarning, "Parameter `average` has been replaced with `op` and will be removed in v1.0")]
e = expect_raises("op and average", ValueError, hvd.allreduce, x, average=True, op=hvd.Sum)
assert str(e) == "The op parameter supersedes average. Please provide only one of them.", str(e)
print("DONE")
""")


@pytest.mark.timeout(300)
def test_behaviour_pins():
    run(
        """
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
    check("grouped_allreduce_async",
          hvd.synchronize(hvd.grouped_allreduce_async([v], op=hvd.Sum, process_set=ps))[0], set_sum)
    check("grouped_allreduce_", hvd.grouped_allreduce_([v.clone()], op=hvd.Sum, process_set=ps)[0], set_sum)
    check("grouped_allreduce_async_",
          hvd.synchronize(hvd.grouped_allreduce_async_([v.clone()], op=hvd.Sum, process_set=ps))[0], set_sum)
    gathered = torch.tensor([float(r) for r in members])
    check("allgather", hvd.allgather(v[:1], process_set=ps), gathered)
    check("allgather_async", hvd.synchronize(hvd.allgather_async(v[:1], process_set=ps)), gathered)
    check("grouped_allgather", hvd.grouped_allgather([v[:1]], process_set=ps)[0], gathered)
    check("grouped_allgather_async", hvd.synchronize(hvd.grouped_allgather_async([v[:1]], process_set=ps))[0],
          gathered)
    root = torch.full((2,), 2.0)
    check("broadcast", hvd.broadcast(v, 2, process_set=ps), root)
    check("broadcast_async", hvd.synchronize(hvd.broadcast_async(v, 2, process_set=ps)), root)
    check("broadcast_", hvd.broadcast_(v.clone(), 2, process_set=ps), root)
    check("broadcast_async_", hvd.synchronize(hvd.broadcast_async_(v.clone(), 2, process_set=ps)), root)
    check("alltoall", hvd.alltoall(v, process_set=ps), gathered)
    check("alltoall_async", hvd.synchronize(hvd.alltoall_async(v, process_set=ps))[0], gathered)
    check("reducescatter", hvd.reducescatter(v, op=hvd.Sum, process_set=ps), set_sum[:1])
    check("reducescatter_async", hvd.synchronize(hvd.reducescatter_async(v, op=hvd.Sum, process_set=ps)),
          set_sum[:1])
    check("grouped_reducescatter", hvd.grouped_reducescatter([v], op=hvd.Sum, process_set=ps)[0], set_sum[:1])
    check("grouped_reducescatter_async",
          hvd.synchronize(hvd.grouped_reducescatter_async([v], op=hvd.Sum, process_set=ps))[0], set_sum[:1])
    hvd.barrier(process_set=ps)
    assert hvd.broadcast_object("from 2" if R == 2 else None, root_rank=2, process_set=ps) == "from 2"
    assert hvd.allgather_object(R, process_set=ps) == members
    torch.manual_seed(R)
    model = nn.Linear(2, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0, process_set=ps)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (R + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=0, process_set=ps)
    assert opt.param_groups[0]["lr"] == 0.01
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), process_set=ps)
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
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), process_set=ps)
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
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=[(f"w.{kwargs}.{passes}", model.weight)], **kwargs)
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
z = torch.full((N, 2), 1.0 + 2 ** -12)
check("fp16 reducescatter", hvd.reducescatter(z, op=hvd.Sum, compression=hvd.Compression.fp16, name="rs.fp16"),
      torch.full((1, 2), float(N)))
check("plain reducescatter", hvd.reducescatter(z, op=hvd.Sum, name="rs.fp32"),
      torch.full((1, 2), N * (1.0 + 2 ** -12)))
print("DONE")
""",
        np=3,
        timeout=200,
    )
