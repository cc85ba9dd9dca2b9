# Job script: the ring reduces incoming bytes where the channel holds them (straight out of a shared-memory
# ring, or through a bounce buffer on TCP). Streams between ranks carry messages of any length (negotiation,
# odd-sized broadcasts), so the ring's data can start at any byte offset in a channel's stream. Before each
# large allreduce, every rank broadcasts 1-7 stray bytes, shifting every stream; the allreduce must still give
# the exact sum and Average for element sizes 1, 2, 4 and 8.
# Prepended by the test: sys.path setup so that `import hvdjob` works.
import itertools

import torch
from hvdjob import check, horovod_scale, make

import hvdlite.torch as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
count = 0
DTYPES = [torch.uint8, torch.int16, torch.float16, torch.float32, torch.int64, torch.float64]
SHAPE = (301, 257)  # an odd element count: uneven ring segments, and bytes that are no multiple of the chunks

for shift, dtype in itertools.product(range(8), DTYPES):
    for root in range(n):
        stray = hvd.broadcast(
            torch.arange(shift, dtype=torch.uint8) + root, root, name=f"stray.{shift}.{dtype}.{root}"
        )
        check(f"stray bytes from {root}", stray, torch.arange(shift, dtype=torch.uint8) + root)
    inputs = [make(r, ("ring", shift, dtype), SHAPE, dtype, 0, 20) for r in range(n)]
    wide = torch.stack([x.to(torch.float64 if dtype.is_floating_point else torch.int64) for x in inputs]).sum(0)
    total = wide.to(dtype)
    got = hvd.allreduce(inputs[me], op=hvd.Sum, name=f"ring.sum.{shift}.{dtype}")
    check(f"Sum {dtype} after {shift} stray bytes (rank {me} of {n})", got, total)
    # Average: the ring scales each rank's segment as its last piece lands; Horovod's rule gives the numbers
    # (the sum of small integers is exact in every dtype here, so the order of additions does not matter).
    got = hvd.allreduce(inputs[me], op=hvd.Average, name=f"ring.avg.{shift}.{dtype}")
    check(f"Average {dtype} after {shift} stray bytes (rank {me} of {n})", got, horovod_scale(total, 1.0 / n))
    count += 2
print(f"OK {count}", flush=True)
