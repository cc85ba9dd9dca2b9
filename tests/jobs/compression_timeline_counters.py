"""With a timeline, every step of a compressing optimizer adds a counter event of the bytes sent against the
uncompressed and their ratio, local SGD one of the bytes averaged, and bounded staleness one of the exchanges
in flight and the bytes applied; the trace stays well formed."""

import sys

import torch
import torch.nn as nn
from compression_common import hvd

hvd.start_timeline(sys.argv[1])
for label, settings in (
    ("powersgd", dict(compression=hvd.Compression.powersgd(rank=1, start_iter=1))),
    ("topk", dict(compression=hvd.Compression.topk(ratio=0.02, start_iter=1))),
    ("local", dict(sync_every=2)),
    ("stale", dict(staleness=2)),
):
    torch.manual_seed(0)
    net = nn.Linear(64, 32)  # a model per optimizer: each one's hooks count the passes of its parameters
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1),
        named_parameters=[(f"{label}.{n}", p) for n, p in net.named_parameters()],
        **settings,
    )
    for step in range(4):
        opt.zero_grad()
        net(torch.randn(4, 64)).pow(2).sum().backward()
        opt.step()
    # Staleness leaves the last steps' averages in flight: a rank leaving first would stop its peer's last step.
    opt.drain()
hvd.stop_timeline()
