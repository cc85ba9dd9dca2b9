"""In-place grouped allreduces of host tensors, which travel packed into one buffer (hvdlite/torch/packed_groups.py),
against the sums computed here, and every way ranks can disagree about a group: each must fail on every rank
naming the member, the ranks and what differs, as a member-by-member group's error does, and leave the next
calls working."""

import torch

import hvdlite.torch as hvd
from hvdlite.torch import packed_groups

hvd.init()
rank, size = hvd.rank(), hvd.size()
others = "rank 1" if size == 2 else f"ranks {', '.join(str(r) for r in range(1, size))}"
assert size > 1


def member(i, shape, dtype=torch.float32, r=rank):
    return (torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape) * (i + 1) + 10 * r).to(dtype)


def summed(i, shape, dtype=torch.float32):
    return sum(member(i, shape, dtype, r) for r in range(size))


def expect_mismatch(what, tensors, name, words, mismatched=(1,)):
    """The grouped allreduce fails with a MismatchError naming words; the members that disagree stay as they
    were (the others are reduced, as in a member-by-member group)."""
    before = [t.clone() for t in tensors]
    try:
        hvd.grouped_allreduce_(tensors, name=name, op=hvd.Sum)
    except hvd.MismatchError as e:
        message = str(e)
        missing = [w for w in words if w not in message]
        assert not missing, f"{what}: {missing} not in {message!r}"
        assert "packed" not in message, f"{what}: the error names the packed buffer: {message!r}"
    else:
        raise AssertionError(f"{what}: no MismatchError")
    for i in mismatched:
        assert torch.equal(tensors[i], before[i]), f"{what}: member {i} changed"


shapes = [(3, 4), (5,), (2, 2, 2), ()]
# The same named group step after step (packed once, then reused), then unnamed, then with strided members.
for step in range(3):
    group = [member(i, s) for i, s in enumerate(shapes)]
    out = hvd.grouped_allreduce_(group, name="grp", op=hvd.Sum)
    assert out is not None and all(o is g for o, g in zip(out, group))
    for i, s in enumerate(shapes):
        assert torch.equal(group[i], summed(i, s)), (step, i, group[i])
assert [key[0] for key in packed_groups._groups] == ["grp"], list(packed_groups._groups)

group = [member(i, s, torch.float64) for i, s in enumerate(shapes)]
hvd.grouped_allreduce_(group, op=hvd.Sum)
assert all(torch.equal(group[i], summed(i, s, torch.float64)) for i, s in enumerate(shapes))

strided = [member(0, (4, 3)).t().requires_grad_(), member(1, (6,))[::2]]
expected = [summed(0, (4, 3)).t(), summed(1, (6,))[::2]]
hvd.grouped_allreduce_(strided, name="grp.strided", op=hvd.Sum)
assert all(torch.equal(t, e) for t, e in zip(strided, expected)), strided

# Into new tensors: each has storage of its own, and the inputs stay as they were.
for step in range(2):
    inputs = [member(i, s) for i, s in enumerate(shapes)] + [member(9, (4, 3)).t()]
    kept = [t.clone() for t in inputs]
    outputs = hvd.grouped_allreduce(inputs, name="grp.new", op=hvd.Sum)
    assert all(torch.equal(t, k) for t, k in zip(inputs, kept)), "an input changed"
    expected = [summed(i, s) for i, s in enumerate(shapes)] + [summed(9, (4, 3)).t()]
    assert all(torch.equal(o, e) for o, e in zip(outputs, expected)), outputs
    assert len({o.untyped_storage().data_ptr() for o in outputs}) == len(outputs), "outputs share storage"
    assert all(o.untyped_storage().nbytes() == o.numel() * o.element_size() for o in outputs)
later = hvd.grouped_allreduce(inputs, name="grp.new", op=hvd.Sum)
assert all(torch.equal(o, e) for o, e in zip(outputs, expected)), "a later call changed earlier results"

# Average, scale factors and an op other than the sum reduce as the members would alone.
group = [member(i, s) for i, s in enumerate(shapes)]
hvd.grouped_allreduce_(group, name="grp.avg", prescale_factor=2.0, postscale_factor=0.5)
assert all(torch.allclose(group[i], summed(i, s) / size) for i, s in enumerate(shapes))
group = [member(i, s) for i, s in enumerate(shapes)]
hvd.grouped_allreduce_(group, name="grp.max", op=hvd.Max)
assert all(torch.equal(group[i], member(i, s, r=size - 1)) for i, s in enumerate(shapes))

# A process set smaller than the job (ranks 0 and 1, or rank 0 alone in a 2-rank job): the packed operation is
# the set's.
members = [0, 1] if size > 2 else [0]
subset = hvd.add_process_set(members)
if rank in members:
    for step in range(2):
        group = [member(i, s) for i, s in enumerate(shapes)]
        hvd.grouped_allreduce_(group, name="grp.subset", op=hvd.Sum, process_set=subset)
        for i, s in enumerate(shapes):
            assert torch.equal(group[i], sum(member(i, s, r=r) for r in members)), (step, i)
hvd.remove_process_set(subset)

# Several dtypes in one group cannot share a buffer: the group still reduces, member by member.
group = [member(0, (3,)), member(1, (2,), torch.float64), member(2, (4,), torch.int32)]
hvd.grouped_allreduce_(group, name="grp.mixed", op=hvd.Sum)
assert torch.equal(group[0], summed(0, (3,))) and torch.equal(group[1], summed(1, (2,), torch.float64))
assert torch.equal(group[2], summed(2, (4,), torch.int32))

# Asynchronous: two named groups in flight at once; then a group queued again, on every rank, before its first
# call is synchronized (once the first has finished, the core takes the name again): the second call must not
# pack into the buffer the first call's result waits in.
a = [member(i, s) for i, s in enumerate(shapes)]
b = [member(i, s) + 1 for i, s in enumerate(shapes)]
ha = hvd.grouped_allreduce_async_(a, name="grp.a", op=hvd.Sum)
hb = hvd.grouped_allreduce_async_(b, name="grp.b", op=hvd.Sum)
hvd.synchronize(hb)
while not hvd.poll(ha):
    pass
hvd.barrier()
again = [member(i, s) + 2 for i, s in enumerate(shapes)]
h_again = hvd.grouped_allreduce_async_(again, name="grp.a", op=hvd.Sum)
hvd.synchronize(ha)
hvd.synchronize(h_again)
assert all(torch.equal(a[i], summed(i, s)) for i, s in enumerate(shapes)), a
assert all(torch.equal(b[i], summed(i, s) + size) for i, s in enumerate(shapes))
assert all(torch.equal(again[i], summed(i, s) + 2 * size) for i, s in enumerate(shapes))

# Disagreements. The same total size laid out differently would reduce unrelated elements if nothing compared the
# layouts: here rank 0 has [2, 3] where the others have [3, 2].
expect_mismatch(
    "shapes of equal size",
    [member(0, (4,)), member(1, (2, 3) if rank == 0 else (3, 2))],
    "mm.layout",
    ["mm.layout.1", "rank 0: [2, 3]", f"{others}: [3, 2]"],
)
expect_mismatch(
    "member sizes",
    [member(0, (4,)), member(1, (3,) if rank == 0 else (5,))],
    "mm.size",
    ["mm.size.1", "rank 0: [3]", f"{others}: [5]"],
)
expect_mismatch(
    "one member's dtype (packed on one rank, not on the others)",
    [member(0, (4,)), member(1, (3,), torch.float32 if rank == 0 else torch.float64)],
    "mm.dtype",
    ["mm.dtype.1", "rank 0: float32", f"{others}: float64"],
)
expect_mismatch(
    "every member's dtype",
    [
        member(0, (4,), torch.float32 if rank == 0 else torch.float64),
        member(1, (3,), torch.float32 if rank == 0 else torch.float64),
    ],
    "mm.dtypes",
    ["mm.dtypes.0", "rank 0: float32", f"{others}: float64"],
    mismatched=(0, 1),
)
try:
    hvd.grouped_allreduce([member(0, (2,)), member(1, (3, 1) if rank == 0 else (1, 3))], name="mm.new", op=hvd.Sum)
except hvd.MismatchError as e:
    assert "mm.new.1" in str(e) and "rank 0: [3, 1]" in str(e), str(e)
else:
    raise AssertionError("a group into new tensors: no MismatchError")
# A group that matched before and then changes on one rank only.
for step in range(2):
    changed = step == 1 and rank == 0
    group = [member(0, (6,)), member(1, (2, 2) if not changed else (4, 1))]
    if step == 0:
        hvd.grouped_allreduce_(group, name="mm.later", op=hvd.Sum)
    else:
        expect_mismatch(
            "a layout changed on one rank", group, "mm.later", ["mm.later.1", "rank 0: [4, 1]", f"{others}: [2, 2]"]
        )

# After all that, the names work again with matching members.
group = [member(0, (4,)), member(1, (3, 2))]
hvd.grouped_allreduce_(group, name="mm.layout", op=hvd.Sum)
assert torch.equal(group[1], summed(1, (3, 2)))
group = [member(0, (4,)), member(1, (2, 2))]
hvd.grouped_allreduce_(group, name="mm.later", op=hvd.Sum)
assert torch.equal(group[1], summed(1, (2, 2)))
print(f"OK {rank}", flush=True)
