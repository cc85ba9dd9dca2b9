# Job script: the per-tensor calls' steady state in C (hvdlite/common/fast_calls.c) against the Python path that
# serves every other case. A seeded random sequence of in-place allreduces under a few names, each call differing
# from the last of its name or not (shape, dtype, op, scale factors, process set, a non-contiguous or a parameter
# tensor, a moved buffer), synchronous or asynchronous, gives every call its own result; each call's path is
# counted, and the C one must take most of the calls that repeat. argv: CALLS SEED.
import random
import sys

import torch
from hvdjob import check, make

import hvdlite.torch as hvd
from hvdlite.common import ops
from hvdlite.torch import core_ops

hvd.init()
n, me = hvd.size(), hvd.rank()
calls, seed = int(sys.argv[1]), int(sys.argv[2])
if ops.fast_calls is None:
    raise AssertionError("a source build's package has no fast calls")
even = hvd.add_process_set([r for r in range(n) if r % 2 == 0])

# Counts what the C calls take (None: the Python path runs).
taken = {"run": 0, "submit": 0, "not": 0}


def counted(name, fn):
    def call(*args):
        result = fn(*args)
        taken[name if result is not None else "not"] += 1
        return result

    return call


core_ops._fast_run = counted("run", core_ops._fast_run)
core_ops._fast_submit = counted("submit", core_ops._fast_submit)

OPS = {"sum": hvd.Sum, "average": hvd.Average, "max": hvd.Max, "none": None}
rng = random.Random(seed)  # the same sequence on every rank
names = [f"fast.{i}" for i in range(4)]
last = {}
parameter = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
pending = []


def expected(key, shape, dtype, op, pre, post, members):
    inputs = torch.stack([make(r, key, shape, dtype) for r in members]).to(torch.float64)
    if op is hvd.Max:
        out = inputs.max(dim=0).values
    else:
        out = inputs.sum(dim=0) * pre * post
        if op in (hvd.Average, None):
            out = out / len(members)
    return out


for i in range(calls):
    name = rng.choice(names)
    form = last.get(name)
    if form is None or rng.random() < 0.15:  # a new form under this name
        form = {
            "shape": rng.choice([(3,), (2, 2), (5,)]),
            "dtype": rng.choice([torch.float32, torch.float64]),
            "op": rng.choice(list(OPS)),
            "scale": rng.choice([(1.0, 1.0), (2.0, 0.5)]),
            "set": rng.choice(["global", "even"]),
        }
        last[name] = form
    kind = rng.choice(["plain"] * 6 + ["strided", "parameter"])
    sync = rng.random() < 0.5
    members = list(range(n)) if form["set"] == "global" else [r for r in range(n) if r % 2 == 0]
    if me not in members:
        continue
    key = ("fast", i)
    shape, dtype = form["shape"], form["dtype"]
    value = make(me, key, shape, dtype)
    if kind == "strided":  # a non-contiguous view: the Python path reduces a contiguous copy
        tensor = torch.zeros(shape + (2,), dtype=dtype)[..., 0]
        tensor.copy_(value)
    elif kind == "parameter" and shape == (3,) and dtype == torch.float32:
        tensor = parameter
        tensor.data.copy_(value)
    else:
        tensor = value.clone()
    op = OPS[form["op"]]
    pre, post = form["scale"]
    process_set = hvd.global_process_set if form["set"] == "global" else even
    want = expected(key, shape, dtype, op, pre, post, members).to(dtype)
    arguments = dict(name=f"{name}.{form['set']}", op=op, prescale_factor=pre, postscale_factor=post)
    arguments["process_set"] = process_set
    if sync:
        hvd.allreduce_(tensor, **arguments)
        check(f"call {i} ({kind}, synchronous, {form})", tensor.detach(), want, exact=False)
    else:
        handle = hvd.allreduce_async_(tensor, **arguments)
        result = hvd.synchronize(handle)
        check(f"call {i} ({kind}, asynchronous, {form})", result.detach(), want, exact=False)
        check(f"call {i}'s tensor ({kind})", tensor.detach(), want, exact=False)

# Repeating calls of one form on contiguous tensors make up about two thirds of this rank's calls: the C calls
# must have taken most of those.
made = sum(taken.values())
if taken["run"] + taken["submit"] < 0.4 * made:
    raise AssertionError(f"the fast calls took {taken} of this rank's {made}")
hvd.barrier()  # the members of the smaller set may still be at work
print(f"OK {calls} {taken}", flush=True)
hvd.shutdown()
