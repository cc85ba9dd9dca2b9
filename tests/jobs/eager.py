# Job script: eager small allreduces (runtime/eager.h), whose data rides on the negotiation exchange once their
# response is cached. Every dtype and reduce op, pre/postscale, ranks that submit in their own order and lag
# behind each other (cycles in which only some ranks have a tensor: its reduced segment must be thrown away and
# contributed again), a synchronous loop whose values change every step (a stale or partial result shows), and
# tensors too big for the eager region next to ones that fit, and a metric cached after many idle scalars.
# argv[1]: "on" or "off": whether rank 0's timeline (HVDLITE_TIMELINE) must show eager spans;
# argv[2]: HVDLITE_EAGER_ALLREDUCE_BYTES as set for the job (the budget the layout fills).
import os
import sys
import time

import torch
from hvdjob import ALL_DTYPES, FLOAT_DTYPES, check, make, prefill_cache, reduce_reference, value_range

import hvdlite.timeline
import hvdlite.torch as hvd

EXPECT = sys.argv[1]
BUDGET = int(sys.argv[2])
hvd.init()
prefill_cache(hvd)
n, me = hvd.size(), hvd.rank()
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Max": hvd.Max, "Min": hvd.Min, "Product": hvd.Product}
SCALES = [(1.0, 1.0), (0.5, 3.0)]
count = 0

specs = []  # (name, shape, dtype, op, prescale, postscale)
for i, dtype in enumerate(ALL_DTYPES):
    for j, opname in enumerate(OPS):
        if dtype == torch.bool and opname == "Average":
            continue
        pre, post = SCALES[(i + j) % 2] if dtype != torch.bool else (1.0, 1.0)
        specs.append((f"e.{dtype}.{opname}", ((i + j) % 3 + 1,), dtype, opname, pre, post))
specs.append(("big", (5000,), torch.float32, "Sum", 1.0, 1.0))  # 20,000 bytes: more than any eager region

# First (so that it takes cache position 0, inside any budget): a synchronous loop in place, as a training
# loop's loss or metric, with a new value every step and one rank behind now and then. A result left over from a
# cycle in which not every rank had the tensor would show.
t = torch.zeros(2, dtype=torch.float64)
for step in range(300):
    t.copy_(torch.tensor([step * (me + 1), me - step], dtype=torch.float64))
    if step % 37 == me:
        time.sleep(0.002)
    hvd.allreduce_(t, name="loss", op=hvd.Sum)
    ranks = range(n)
    check(
        f"loss step {step}",
        t,
        torch.tensor([step * sum(r + 1 for r in ranks), sum(ranks) - n * step], dtype=torch.float64),
    )
    count += 1

for rep in range(6):
    handles = []
    order = specs[me * 5 % len(specs) :] + specs[: me * 5 % len(specs)]
    for k, (name, shape, dtype, opname, pre, post) in enumerate(order):
        lo, hi = value_range(opname, dtype)
        inputs = [make(r, (name, rep), shape, dtype, lo, hi) for r in range(n)]
        expected = reduce_reference(inputs, opname, dtype, pre, post)
        exact = opname != "Average" or dtype not in FLOAT_DTYPES
        handles.append(
            (
                name,
                expected,
                exact,
                hvd.allreduce_async(
                    inputs[me], name=name, op=OPS[opname], prescale_factor=pre, postscale_factor=post
                ),
            )
        )
        if (k + rep + me) % 9 == 0:
            time.sleep(0.003 * (me + 1))  # the ranks fall out of step: some cycles see a tensor on some ranks only
    for name, expected, exact, handle in handles:
        check(f"{name} rep {rep}", hvd.synchronize(handle), expected, exact)
        count += 1

# 40 scalars reduced once (values at start-up), then a metric averaged every step. They and every tensor above are
# cached before it and are no larger, but idle from now on: the metric must come to ride in the region.
for i in range(40):
    hvd.allreduce_(torch.tensor([float(me + i)]), name=f"startup.{i}", op=hvd.Sum)
metric = torch.zeros(1, dtype=torch.float64)
for step in range(400):
    metric.fill_(step * (me + 1))
    hvd.allreduce_(metric, name="late.metric", op=hvd.Sum)
    check(f"late metric step {step}", metric, torch.tensor([float(step * sum(r + 1 for r in range(n)))]).double())
    count += 1

hvd.shutdown()
if me == 0:
    events = hvdlite.timeline.load(os.environ["HVDLITE_TIMELINE"])
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    eager = {rows[e["pid"]] for e in events if e.get("ph") == "B" and e.get("name") == "ALLREDUCE (eager)"}
    if EXPECT == "off":
        assert not eager, f"eager spans with the eager path off: {sorted(eager)}"
    else:
        assert "loss" in eager, sorted(eager)
        assert "late.metric" in eager, "a metric averaged every step stayed out of the region behind idle tensors"
        assert "big" not in eager, "a 20,000-byte tensor went through the eager region"
        # Some of the small tensors ride along whatever the budget; with a budget that holds them all (each padded
        # to 8 bytes) and the 16-byte loss, every one of them must have ridden at least once.
        small = [s for s in specs if s[0] != "big"]
        riding = [s[0] for s in small if s[0] in eager]
        assert len(riding) >= min(len(small), 4), f"only {riding} went eagerly"
        if BUDGET >= sum(-(-(s[1][0] * s[2].itemsize) // 8) * 8 for s in small) + 16:
            assert set(s[0] for s in small) <= eager, sorted(set(s[0] for s in small) - eager)
print(f"OK {count}", flush=True)
