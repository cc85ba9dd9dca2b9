# Job script: hvdlite.torch behaves as Horovod's where Horovod's own tests look.
# - join() with names already in the response cache: each rank joins first in turn while the others allreduce
#   the cached names again; the joined rank counts as zeros (Horovod's join test, with and without a cached
#   first round, for several dtypes and shapes that change under the same names).
# - a step that fails while a rank has joined leaves nothing behind: once every rank has joined, the next
#   collectives run normally.
# - alltoall refuses non-integer splits with a ValueError naming the tensor and the dtype.
# - DistributedOptimizer exposes _parameter_names; collectives refuse None with a TypeError; init takes
#   process_sets="dynamic".
# Prepended by the test: sys.path setup so that `import hvdjob` works.
import itertools

import torch
from hvdjob import CheckFailure, check

import hvdlite.torch as hvd

hvd.init(process_sets="dynamic")  # Horovod's spelling for process sets added after init
n, me = hvd.size(), hvd.rank()
count = 0

# ------------------------------------------------------------------------------------------- join and the cache
for dtype, dim, first, cached in itertools.product(
    [torch.int32, torch.float32, torch.float64], [1, 3], range(n), [False, True]
):
    torch.manual_seed(1234)
    a = torch.empty(*([5] * dim)).random_(-100, 100).to(dtype)
    b = torch.empty(*([17] * dim)).random_(-100, 100).to(dtype)
    if cached:
        hvd.synchronize(hvd.allreduce_async(a, name="tensor_a", op=hvd.Sum))
        hvd.synchronize(hvd.allreduce_async(b, name="tensor_b", op=hvd.Sum))
    if me == first:
        last = hvd.join()
    else:
        ha = hvd.allreduce_async(a, name="tensor_a", op=hvd.Sum)
        hb = hvd.allreduce_async(b, name="tensor_b", op=hvd.Sum)
        what = f"{dtype} dim {dim}, rank {first} joined first, cached={cached}"
        check(f"tensor_a, {what}", hvd.synchronize(ha), a * (n - 1))
        check(f"tensor_b, {what}", hvd.synchronize(hb), b * (n - 1))
        last = hvd.join()
    if not 0 <= last < n or last == first:
        raise CheckFailure(f"join() returned {last} with rank {first} joining first")
    count += 1

# ------------------------------------------------------------------- a failed step while a rank has joined
if me == 0:
    hvd.join()
else:
    try:
        hvd.alltoall(torch.arange(float(n)), name="during_join")
        raise CheckFailure("alltoall ran while rank 0 had joined")
    except CheckFailure:
        raise
    except Exception as error:  # the message names the joined rank
        if "0" not in str(error) or "joined" not in str(error):
            raise CheckFailure(f"alltoall during join failed with an unclear message: {error}") from None
    hvd.join()
check(
    "allreduce after a failed step and a completed join",
    hvd.allreduce(torch.ones(3), op=hvd.Sum),
    torch.full((3,), float(n)),
)
check(
    "alltoall after a completed join",
    hvd.alltoall(torch.full((n,), float(me)), name="after_join"),
    torch.arange(float(n)),
)
count += 1

# ------------------------------------------------------------------------------------------ argument checks
for splits in (torch.ones(n, dtype=torch.float32), [1.0] * n):
    try:
        hvd.alltoall(torch.arange(float(n)), splits=splits, name="float_splits")
        raise CheckFailure(f"alltoall accepted splits {splits!r}")
    except ValueError as error:
        if "float_splits" not in str(error) or "float" not in str(error):
            raise CheckFailure(f"the splits error names neither tensor nor dtype: {error}") from None
    count += 1
got, received = hvd.alltoall(torch.arange(float(n)), splits=torch.ones(n, dtype=torch.int64), name="int64_splits")
check("alltoall with int64 splits", received, torch.ones(n, dtype=torch.int64))
try:
    hvd.broadcast(None, 0)
    raise CheckFailure("broadcast(None) ran")
except TypeError as error:
    if "NoneType" not in str(error):
        raise CheckFailure(f"broadcast(None): unclear message {error}") from None
count += 1

model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
model[0].bias.requires_grad = False
for named in (True, False):
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters() if named else None
    )
    names = opt._parameter_names
    want = dict(model.named_parameters()) if named else None
    if set(map(id, names)) != set(map(id, model.parameters())):
        raise CheckFailure("_parameter_names does not hold every parameter")
    if named and any(names[p] != k for k, p in want.items()):
        raise CheckFailure(f"_parameter_names {sorted(names.values())} differ from the model's names")
    if len(set(names.values())) != len(names):
        raise CheckFailure(f"_parameter_names are not unique: {sorted(names.values())}")
    count += 1

print(f"OK {count}", flush=True)
hvd.shutdown()
