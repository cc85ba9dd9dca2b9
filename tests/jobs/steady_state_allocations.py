"""C++ heap allocations of steady-state collectives, counted by hvdlite_core/tests/count_allocations.cc (loaded
with LD_PRELOAD). argv: K, steps. A step runs K named 1 KB allreduces, after warm-up steps that negotiate and cache
every name, in five ways: through the core's C ABI alone (submit each, then wait for and release each), through
hvdlite.torch's asynchronous calls (allreduce_async_ each, then synchronize each: a DistributedOptimizer's
pattern), through its synchronous hvd.allreduce_, as one named grouped_allreduce_, and as a DistributedOptimizer
step of K parameters whose gradients persist; and a sixth, a few unnamed synchronous allreduce_ calls a step (metrics
averaged without a name, which the core names and caches by what they carry). Prints the allocations per
operation of each way, counted on both of the rank's threads (the caller's and the background thread), and the
Python garbage collections each way set off per step: objects kept alive per tensor for a step make the collector
run passes over the whole heap, a cost that grows faster than the tensor count."""

import ctypes
import gc
import sys

import torch

import hvdlite.torch as hvd
from hvdlite.common import ops

hvd.init()
k, steps = (int(a) for a in sys.argv[1:3])
rank, size = hvd.rank(), hvd.size()
allocations = ctypes.CDLL(None).hvdlite_test_allocations
allocations.restype = ctypes.c_ulonglong
tensors = [torch.full((256,), float(rank + 1)) for _ in range(k)]
names = [f"model.layers.{i}.attention.weight" for i in range(k)]  # past short-string storage, as real names are
FLOAT32, AVERAGE = 6, 1
requests = [
    ops.request(0, n, FLOAT32, (256,), t.data_ptr(), t.data_ptr(), reduce_op=AVERAGE) for t, n in zip(tensors, names)
]


def core_step():
    for handle in [ops.submit(q) for q in requests]:
        ops.wait(handle)
        ops.release(handle)


def async_step():
    for handle in [hvd.allreduce_async_(t, name=n) for t, n in zip(tensors, names)]:
        hvd.synchronize(handle)


def sync_step():
    for t, n in zip(tensors, names):
        hvd.allreduce_(t, name=n)


UNNAMED_PER_STEP = 64


def unnamed_step():
    for t in tensors[:UNNAMED_PER_STEP]:
        hvd.allreduce_(t)


def grouped_step():
    hvd.grouped_allreduce_(tensors, name="model.gradients")


parameters = [torch.nn.Parameter(torch.zeros(256)) for _ in range(k)]
for p in parameters:
    p.grad = torch.full((256,), float(rank + 1))
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(parameters, lr=0.0), named_parameters=[(f"{n}.parameter", p) for n, p in zip(names, parameters)]
)


def optimizer_step():
    # The gradients persist from step to step (as with zero_grad(set_to_none=False)), so a step makes no tensor:
    # only what DistributedOptimizer keeps per parameter would set off collections.
    optimizer.step()


collections = [0]
gc.callbacks.append(lambda phase, info: collections.__setitem__(0, collections[0] + (phase == "start")))


def per_operation(step, operations=k):
    """(C++ allocations per operation, garbage collections per step)."""
    # Warm-up: negotiation, the response cache, the Python side's caches, and the core's pools of entries and
    # handle states grown to the most operations this way has in flight at once (it varies from step to step).
    for _ in range(8):
        step()
    hvd.barrier()
    before, collected = allocations(), collections[0]
    for _ in range(steps):
        step()
    counted, collected = allocations() - before, collections[0] - collected
    hvd.barrier()
    return counted / (steps * operations), collected / steps


ways = (core_step, async_step, sync_step, grouped_step, optimizer_step, unnamed_step)
counts, passes = {}, {}
for way in ways:
    operations = UNNAMED_PER_STEP if way is unnamed_step else k
    counts[way.__name__[: -len("_step")]], passes[way.__name__[: -len("_step")]] = per_operation(way, operations)
average = (size + 1) / 2  # the average of 1, ..., size, and of that again
assert all(bool((t == average).all()) for t in (tensors[0], tensors[-1])), tensors[0][:4]
assert all(bool((p.grad == average).all()) for p in (parameters[0], parameters[-1])), parameters[0].grad[:4]
print(f"ALLOCATIONS rank={rank} k={k} " + " ".join(f"{way}={n:.2f}" for way, n in counts.items()), flush=True)
print(f"COLLECTIONS rank={rank} k={k} " + " ".join(f"{way}={n:.2f}" for way, n in passes.items()), flush=True)
