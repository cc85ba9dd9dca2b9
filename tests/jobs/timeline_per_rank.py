"""A timeline path with {rank} gives every rank its own file, each a valid trace of the allreduce. argv[1]: a
folder."""

import os
import sys

import torch

import hvdlite.torch as hvd
from hvdlite.timeline import activities, check, load

hvd.init()
out = sys.argv[1]
hvd.start_timeline(os.path.join(out, "tl.{rank}.json"))
hvd.allreduce(torch.ones(8), name="grad.w", op=hvd.Sum)
hvd.stop_timeline()
hvd.barrier()
for rank in range(hvd.size()):
    events = load(os.path.join(out, f"tl.{rank}.json"))
    assert not check(events), check(events)
    assert "grad.w" in activities(events, "ALLREDUCE"), activities(events, "ALLREDUCE")
assert not os.path.exists(os.path.join(out, "tl.{rank}.json"))
