"""backward_passes_per_step=2 accumulates two passes locally and averages their sum over the ranks: the
single-process result on the global batch."""

import torch
import torch.nn.functional as F
from training_common import N, assert_same_everywhere, data, flat, hvd, make_model, shard

model, ref = make_model(), make_model()
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05),
    named_parameters=model.named_parameters(),
    backward_passes_per_step=2,
)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
for step in range(3):
    x, y = data(step, rows_per_rank=8)
    xs, ys = shard(x, 8), shard(y, 8)
    opt.zero_grad()
    for micro in range(2):  # gradients accumulate locally over two passes, then one allreduce
        F.cross_entropy(model(xs[micro * 4 : (micro + 1) * 4]), ys[micro * 4 : (micro + 1) * 4]).backward()
    opt.step()
    ref_opt.zero_grad()
    loss = (
        sum(
            F.cross_entropy(ref(x[r * 8 + m * 4 : r * 8 + (m + 1) * 4]), y[r * 8 + m * 4 : r * 8 + (m + 1) * 4])
            for r in range(N)
            for m in range(2)
        )
        / N
    )
    loss.backward()
    ref_opt.step()
assert_same_everywhere(model, "accumulate")
assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()
# A third backward pass before step() is a usage error, not silent double counting.
opt.zero_grad()
for micro in range(2):
    F.cross_entropy(model(xs[:4]), ys[:4]).backward()
try:
    F.cross_entropy(model(xs[:4]), ys[:4]).backward()
except AssertionError as e:
    assert "backward_passes_per_step" in str(e)
else:
    raise SystemExit("a third backward pass was accepted")
opt.synchronize()  # finish the reductions of the second pass on every rank before any rank shuts down
