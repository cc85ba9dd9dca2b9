# Job script: prescale/postscale factors and integer Average give Horovod's numbers, bit for bit.
# Horovod's CPU rule (ScaleBuffer, with Average folded into the postscale as postscale / size): integers are
# multiplied in double and truncated toward zero; float16/bfloat16 are widened to float32, multiplied by the
# factor rounded to float32 and rounded back to nearest-even; float32 uses the factor rounded to float32.
# The reference below applies that rule with torch, rank by rank. Sums of halves round after every addition,
# so their result depends on the order of the additions: with two ranks it does not (a + b == b + a), and
# floats are compared exactly; with more ranks they are compared within the dtype's tolerance. Integers are
# compared exactly always (wrapping included: the inputs span the whole int8 range).
# Prepended by the test: sys.path setup so that `import hvdjob` works.
import itertools

import torch
from hvdjob import FLOAT_DTYPES, INT_DTYPES, check, even_rows, horovod_scale, make

import hvdlite.torch as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Max": hvd.Max}
DTYPES = list(INT_DTYPES) + list(FLOAT_DTYPES)
FACTORS = [(0.5, 3.0), (3.0, 1 / 3), (1 / 3, 0.5), (1.0, 1 / 3), (1 / 3, 1.0), (-0.5, 1.0), (1.0, 0.1)]
count = 0


def horovod_reference(inputs, opname, dtype, pre, post):
    """Horovod's allreduce result: scale each rank's input, reduce in the dtype's arithmetic, then scale by
    postscale (postscale / n for Average)."""
    xs = [horovod_scale(x, pre) for x in inputs]
    if dtype in FLOAT_DTYPES:
        total = xs[0].clone()
        for x in xs[1:]:
            total = torch.maximum(total, x) if opname == "Max" else total + x  # halves: float32 math, rounded
    else:
        wide = torch.stack([x.to(torch.int64) for x in xs])
        total = (wide.max(0).values if opname == "Max" else wide.sum(0)).to(dtype)  # wraps like the dtype
    return horovod_scale(total, post / n if opname == "Average" else post)


def inputs_for(key, shape, dtype):
    inputs = [make(r, key, shape, dtype, -100, 100) for r in range(n)]
    if dtype in FLOAT_DTYPES:  # fractions too, not only integers
        inputs = [(x.to(torch.float64) * 0.37 + 0.125).to(dtype) for x in inputs]
    if dtype in (torch.int8, torch.uint8):  # the whole range: products wrap
        inputs = [make(r, key, shape, torch.int8, -128, 127).to(torch.int64).to(dtype) for r in range(n)]
    return inputs


EPSILON = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23, torch.float64: 2.0**-52}


def compare(what, got, expected, dtype, inputs, pre, post):
    if n == 2 or dtype not in FLOAT_DTYPES:
        check(what, got, expected)
        return
    # Another order of additions: each rounding is within half a unit of the partial sum, itself bounded by
    # the sum of magnitudes; the postscale and its own rounding add their share.
    check(what + " (shape, dtype)", got.clone().zero_(), expected.clone().zero_())
    magnitude = sum(horovod_scale(x, pre).to(torch.float64).abs() for x in inputs) * abs(post)
    bound = EPSILON[dtype] * (n * magnitude + expected.to(torch.float64).abs()) + 1e-300
    error = (got.to(torch.float64) - expected.to(torch.float64)).abs()
    if bool((error > bound).any()):
        i = int((error > bound).reshape(-1).nonzero()[0])
        raise AssertionError(
            f"{what}: element {i} is {got.reshape(-1)[i].item()}, Horovod's rule gives "
            f"{expected.reshape(-1)[i].item()} (more than another summation order explains)"
        )


# allreduce: small (fused with its neighbours in one cycle) and large (reduced alone, ring path)
for dtype, opname, (pre, post) in itertools.product(DTYPES, OPS, FACTORS):
    for shape in ((37,), (700, 300)):
        if shape[0] == 700 and (opname == "Max" or (pre, post) not in FACTORS[:3]):
            continue
        key = ("scaling", dtype, opname, pre, post, shape)
        inputs = inputs_for(key, shape, dtype)
        expected = horovod_reference(inputs, opname, dtype, pre, post)
        what = f"allreduce {dtype} {opname} pre={pre:.4g} post={post:.4g} shape {shape}"
        out = hvd.allreduce(
            inputs[me], op=OPS[opname], prescale_factor=pre, postscale_factor=post, name=f"scale.{key}"
        )
        compare(what, out, expected, dtype, inputs, pre, post / n if opname == "Average" else post)
        count += 1

# grouped allreduce (fused) and grouped reducescatter, every dtype at once per factor pair
for opname, (pre, post) in itertools.product(("Sum", "Average"), FACTORS):
    key = ("grouped", opname, pre, post)
    groups = [inputs_for(key + (str(d),), (2 * n + 1, 5), d) for d in DTYPES]
    outs = hvd.grouped_allreduce(
        [g[me] for g in groups], op=OPS[opname], prescale_factor=pre, postscale_factor=post, name=f"gar.{key}"
    )
    for d, g, o in zip(DTYPES, groups, outs):
        compare(
            f"grouped_allreduce {d} {opname} pre={pre:.4g} post={post:.4g}",
            o,
            horovod_reference(g, opname, d, pre, post),
            d,
            g,
            pre,
            post / n if opname == "Average" else post,
        )
    outs = hvd.grouped_reducescatter(
        [g[me] for g in groups], op=OPS[opname], prescale_factor=pre, postscale_factor=post, name=f"grs.{key}"
    )
    split = even_rows(2 * n + 1, n)
    start = sum(split[:me])
    for d, g, o in zip(DTYPES, groups, outs):
        compare(
            f"grouped_reducescatter {d} {opname} pre={pre:.4g} post={post:.4g}",
            o,
            horovod_reference(g, opname, d, pre, post)[start : start + split[me]],
            d,
            [x[start : start + split[me]] for x in g],
            pre,
            post / n if opname == "Average" else post,
        )
    count += 1

# integer Average is Sum then postscale 1/n, truncated toward zero (not rounded, not floored)
sums = torch.tensor([7, -7, 5, -5, 1, -1, 0], dtype=torch.int64)
x = (sums if me == 0 else torch.zeros_like(sums)).to(torch.int32)
check(
    "integer Average truncates toward zero",
    hvd.allreduce(x, op=hvd.Average, name="int.average"),
    torch.trunc(sums.to(torch.float64) / n).to(torch.int32),
)
count += 1

print(f"OK {count}", flush=True)
hvd.shutdown()
