"""Unnamed collectives of a few recurring kinds (in place and not, of several dtypes), one to three in flight at a
time, and now and then a synchronous one, submitted in the same order on
every rank but with each rank's own pauses and its own order of synchronizing: the core caches them by what they
carry, lets one wait as a cache hit only while it is its rank's only one of its kind in flight, and must give
every call its own result whether it met the others as a hit or through the coordinator.

    run_job_function("unnamed_mix:main", np, args=[steps, seed])
"""

import random
import time

import torch
from hvdjob import check, make, prefill_cache, reduce_reference

import hvdlite.torch as hvd


def kinds(n):
    """(label, submit(tensor) -> handle, this rank's input for call i, expected result for call i) of each kind."""

    def allreduce(shape, op_name, op, dtype=torch.float32, in_place=False):
        def inputs(r, i):
            return make(r, ("ar", shape, op_name, str(dtype), i), shape, dtype)

        return (
            f"allreduce{'_' if in_place else ''} {shape} {op_name} {dtype}",
            (lambda t: hvd.allreduce_async_(t, op=op)) if in_place else (lambda t: hvd.allreduce_async(t, op=op)),
            inputs,
            lambda i: reduce_reference([inputs(r, i) for r in range(n)], op_name, dtype),
        )

    def gather_inputs(r, i):
        return make(r, ("ag", i), ((r + i) % 3, 2), torch.float32)  # rows differ by rank and call

    def broadcast_inputs(r, i):
        return make(r, ("bc", i), (4,), torch.float32)

    return [
        allreduce((2,), "Sum", hvd.Sum),
        allreduce((3,), "Sum", hvd.Sum),
        allreduce((2,), "Max", hvd.Max),
        allreduce((2,), "Sum", hvd.Sum, in_place=True),
        allreduce((3,), "Min", hvd.Min, torch.float64, in_place=True),
        allreduce((2,), "Sum", hvd.Sum, torch.int32, in_place=True),
        (
            "allgather",
            lambda t: hvd.allgather_async(t),
            gather_inputs,
            lambda i: torch.cat([gather_inputs(r, i) for r in range(n)]),
        ),
        (
            "broadcast from the last rank",
            lambda t: hvd.broadcast_async(t, root_rank=n - 1),
            broadcast_inputs,
            lambda i: broadcast_inputs(n - 1, i),
        ),
    ]


def main(steps="300", seed="0"):
    hvd.init()
    prefill_cache(hvd)
    n, me = hvd.size(), hvd.rank()
    shared = random.Random(int(seed))  # the same calls on every rank
    own = random.Random(int(seed) * 31 + me)  # this rank's pauses and order of synchronizing
    available = kinds(n)
    checked = 0
    for step in range(int(steps)):
        in_flight = shared.choice([1, 1, 1, 1, 2, 3])
        calls = [(shared.randrange(len(available)), step * 3 + j) for j in range(in_flight)]
        handles = []
        for kind, i in calls:
            label, submit, inputs, expected = available[kind]
            if own.random() < 0.2:
                time.sleep(own.random() * 0.002)
            handles.append((f"{label}, step {step}", submit(inputs(me, i)), expected(i)))
        own.shuffle(handles)
        for what, handle, expected in handles:
            check(what, hvd.synchronize(handle), expected, exact=True)
            checked += 1
        if shared.random() < 0.3:  # a synchronous one, in place or into a new tensor, after the step's
            shape, i, in_place = shared.choice([(2,), (3,)]), -1 - step, shared.random() < 0.5
            mine = make(me, ("sync", shape, i), shape, torch.float32)
            result = hvd.allreduce_(mine, op=hvd.Sum) if in_place else hvd.allreduce(mine, op=hvd.Sum)
            expected = reduce_reference(
                [make(r, ("sync", shape, i), shape, torch.float32) for r in range(n)], "Sum", torch.float32
            )
            check(
                f"synchronous allreduce{'_' if in_place else ''} {shape}, step {step}", result, expected, exact=True
            )
    assert checked >= int(steps)
    hvd.shutdown()
