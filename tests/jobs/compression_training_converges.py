"""A 2-rank MLP learns a teacher's labels through each compressor (and with gradient accumulation) to within
5 points of the same training uncompressed, the weights stay identical on every rank, and compression sends
at most half of the gradients' numbers."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from compression_common import R, hvd, same_everywhere

torch.manual_seed(0)
teacher = nn.Linear(32, 10)
# Enough test points that the accuracy's sampling noise stays well inside the margin.
test_x = torch.randn(4096, 32, generator=torch.Generator().manual_seed(99))
test_y = teacher(test_x).argmax(1)


def train(label, compression, passes):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=[(f"{label}.{n}", p) for n, p in model.named_parameters()],
        compression=compression,
        backward_passes_per_step=passes,
    )
    g = torch.Generator().manual_seed(7 + R)  # the same batches for every configuration
    for step in range(300):
        opt.zero_grad()
        for _ in range(passes):
            x = torch.randn(32, 32, generator=g)
            F.cross_entropy(model(x), teacher(x).argmax(1)).backward()
        opt.step()
    assert same_everywhere(torch.cat([p.detach().flatten() for p in model.parameters()]), label), label
    return (model(test_x).argmax(1) == test_y).float().mean().item(), opt


reference = {passes: train(f"reference{passes}", hvd.Compression.none, passes)[0] for passes in (1, 2)}
for kind, passes in (("powersgd", 1), ("topk", 1), ("powersgd", 2)):
    compression = {
        # Rank 4 still sends under half the numbers. At rank 2 the gap to uncompressed training moves by several
        # points from one seed or CPU to the next, so the bound would judge chance, not the compressor.
        "powersgd": hvd.Compression.powersgd(rank=4, start_iter=5),
        "topk": hvd.Compression.topk(ratio=0.1, start_iter=5),
    }[kind]
    accuracy, opt = train(f"{kind}{passes}", compression, passes)
    reducer = opt.gradient_reducer
    assert reducer.iteration == 300, reducer.iteration
    assert reducer.last_sent_elements * 2 <= reducer.last_dense_elements
    print(f"rank {R} {kind} passes {passes} accuracy {accuracy:.3f} uncompressed {reference[passes]:.3f}", flush=True)
    assert accuracy >= reference[passes] - 0.05 and accuracy > 0.5, (kind, passes, accuracy, reference)
