"""Sparse gradients (an Embedding with sparse=True) reach SparseAdam as sparse tensors through DistributedOptimizer,
and sparse_allreduce_async gathers them as Horovod's does."""

import torch
import torch.nn as nn
from horovod_torch_common import D, N, R, check, expect_raises, hvd

for as_dense in (False, True):
    torch.manual_seed(0)
    emb, ref = nn.Embedding(12, 3, sparse=True), nn.Embedding(12, 3, sparse=True)
    ref.load_state_dict(emb.state_dict())
    opt = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(emb.parameters(), lr=0.05),
        named_parameters=[(f"emb.{as_dense}", emb.weight)],
        sparse_as_dense=as_dense,
    )
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
    for step in range(4):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 12, (N, 5), generator=g)
        opt.zero_grad()
        emb(ids[R]).pow(2).sum().backward()
        opt.synchronize()
        assert emb.weight.grad.is_sparse, f"sparse_as_dense={as_dense}: the optimizer would get a dense gradient"
        with opt.skip_synchronize():
            opt.step()  # SparseAdam raises on a dense gradient
        ref_opt.zero_grad()
        (sum(ref(ids[r]).pow(2).sum() for r in range(N)) / N).backward()  # the mean of the ranks' losses
        ref_opt.step()
    assert torch.allclose(emb.weight, ref.weight, atol=1e-6), (as_dense, (emb.weight - ref.weight).abs().max())

# sparse_allreduce_async: Horovod's signature; the handle is callable (as Horovod's optimizer uses it) and
# synchronize() also accepts it.
dense = [torch.zeros(6, 2, dtype=D) for _ in range(N)]
for r in range(N):
    dense[r][r] = 1.0 + r
    dense[r][4] = 10.0 * (r + 1)  # an index every rank has
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
expect_raises("dense input", ValueError, hvd.sparse_allreduce_async, dense[R], "sp.dense", hvd.Sum, match=["sparse"])
