"""DistributedOptimizer on models that differ between ranks in a way the buckets' sizes do not show: rank 0's
`mixer` weight is [2, 3] where the others' is [3, 2]. Each bucket carries a digest of its layout, so the step
fails on every rank with the error that names the parameter, the ranks and both shapes, instead of averaging
unrelated elements; the process stays usable."""

import torch
import torch.nn as nn

import hvdlite.torch as hvd

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()
others = "rank 1" if size == 2 else f"ranks {', '.join(str(r) for r in range(1, size))}"


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.mixer = nn.Parameter(torch.randn(2, 3) if rank == 0 else torch.randn(3, 2))
        self.last = nn.Linear(4, 1)

    def forward(self, x):
        return self.last(self.first(x)).sum() + self.mixer.sum()


for reduce_during_backward in (True, False):
    model = Model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        reduce_during_backward=reduce_during_backward,
    )
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(8, 4)).backward()
    try:
        optimizer.step()
    except hvd.MismatchError as e:
        message = str(e)
        for words in ("'allreduce.mixer'", "rank 0: [2, 3]", f"{others}: [3, 2]"):
            assert words in message, (words, message)
    else:
        raise AssertionError(
            f"the step of models that differ succeeded (reduce_during_backward={reduce_during_backward})"
        )
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before)), "the failed step updated"
    optimizer.zero_grad()

assert torch.equal(hvd.allreduce(torch.ones(3), name="after", op=hvd.Sum), torch.full((3,), float(size)))
print(f"OK {rank}", flush=True)
