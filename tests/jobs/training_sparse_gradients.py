"""Sparse gradients (an Embedding with sparse=True) train through DistributedOptimizer, as they are or with
sparse_as_dense, as one dense Embedding does on the global batch."""

import torch
import torch.nn as nn
from training_common import N, R, assert_same_everywhere, hvd

for as_dense in (False, True):
    torch.manual_seed(0)
    emb, ref = nn.Embedding(10, 3, sparse=True), nn.Embedding(10, 3)
    ref.load_state_dict(emb.state_dict())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=0.5),
        named_parameters=[(f"emb{as_dense}", emb.weight)],
        sparse_as_dense=as_dense,
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    ids = torch.tensor([[1, 2, 2], [3, 7, 1], [0, 9, 9], [4, 4, 5]])
    mine = ids[R * 2 : (R + 1) * 2]
    opt.zero_grad()
    emb(mine).pow(2).sum().backward()
    opt.step()
    ref_opt.zero_grad()
    (ref(ids).pow(2).sum() / N).backward()
    ref_opt.step()
    assert torch.allclose(emb.weight, ref.weight, atol=1e-6), (emb.weight - ref.weight).abs().max()
    assert_same_everywhere(emb, f"sparse{as_dense}")
