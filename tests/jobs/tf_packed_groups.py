"""TensorFlow's grouped_allreduce of tensors whose shapes are known when traced travels packed into one buffer
(hvdlite/tensorflow/mpi_ops.py), eagerly and inside tf.function: results against the sums computed here, its
gradient, and every way ranks can disagree about a group. Each must fail on every rank naming the member, the
ranks and what differs (not the packed buffer), and leave the next calls working."""

import numpy as np
import tensorflow as tf
from tf_common import MODES, N, R, hvd, run, same

assert N > 1
others = "rank 1" if N == 2 else f"ranks {', '.join(str(r) for r in range(1, N))}"


def member(i, shape, dtype=np.float32, r=R):
    return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * (i + 1) + 10 * r).astype(dtype)


def summed(i, shape, dtype=np.float32):
    return sum(member(i, shape, dtype, r) for r in range(N))


shapes = [(3, 4), (5,), (2, 2, 2), ()]
for mode in MODES:
    for step in range(2):  # the same call site again: its prepared request is reused
        for name in ("grp", None):
            out = run(
                mode,
                lambda: hvd.grouped_allreduce([member(i, s) for i, s in enumerate(shapes)], op=hvd.Sum, name=name),
            )
            for i, s in enumerate(shapes):
                same(f"{mode} {name} step {step} member {i}", out[i], summed(i, s))

    out = run(
        mode,
        lambda: hvd.grouped_allreduce(
            [member(i, s) for i, s in enumerate(shapes)], op=hvd.Average, prescale_factor=2.0, postscale_factor=0.25
        ),
    )
    for i, s in enumerate(shapes):
        same(f"{mode} scaled average {i}", out[i], summed(i, s) * 2.0 * 0.25 / N, atol=1e-4)

    out = run(mode, lambda: hvd.grouped_allreduce([member(0, (4,)), member(1, (2, 3))], op=hvd.Max, name="max"))
    same(f"{mode} max 0", out[0], member(0, (4,), r=N - 1))
    same(f"{mode} max 1", out[1], member(1, (2, 3), r=N - 1))

    # Members of several dtypes: an empty packed operation the ranks agree on, then member by member.
    mixed = [(0, (3,), np.float32), (1, (2, 2), np.int32), (2, (2,), np.float64)]
    out = run(mode, lambda: hvd.grouped_allreduce([member(i, s, d) for i, s, d in mixed], op=hvd.Sum, name="mixed"))
    for i, s, d in mixed:
        same(f"{mode} mixed {i}", out[i], summed(i, s, d))
        assert out[i].dtype == d, (mode, i, out[i].dtype)

# A process set: every rank but the last at 3 ranks, rank 0 alone at 2.
subset = hvd.add_process_set(list(range(max(1, N - 1))))
if subset.included():
    out = hvd.grouped_allreduce([member(0, (2,)), member(1, (3,))], op=hvd.Sum, name="subset", process_set=subset)
    for i, s in ((0, (2,)), (1, (3,))):
        same(f"process set member {i}", out[i], sum(member(i, s, r=r) for r in subset.ranks))

# The gradient of a packed group is the packed allreduce of the gradients.
for mode in MODES:
    variables = [tf.Variable(member(i, s)) for i, s in enumerate(shapes[:3])]

    def gradients():
        with tf.GradientTape() as tape:
            reduced = hvd.grouped_allreduce([v * float(R + 1) for v in variables], op=hvd.Sum, name="differentiable")
            loss = tf.add_n([tf.reduce_sum(t * float(i + 1)) for i, t in enumerate(reduced)])
        return tape.gradient(loss, variables)

    for i, g in enumerate(run(mode, gradients)):
        same(f"{mode} gradient {i}", g, np.full(shapes[i], (i + 1) * N * (R + 1), np.float32))


def expect_mismatch(what, mode, tensors, name, words):
    """The group fails with a MismatchError on every rank that names words and not the packed buffer."""
    try:
        run(mode, lambda: hvd.grouped_allreduce(tensors, op=hvd.Sum, name=name))
    except hvd.MismatchError as e:
        message = str(e)
        missing = [w for w in words if w not in message]
        assert not missing, f"{what} ({mode}): {missing} not in {message!r}"
        assert "packed" not in message.split(":")[0], (
            f"{what} ({mode}): the error names the packed buffer: {message!r}"
        )
    else:
        raise AssertionError(f"{what} ({mode}): no MismatchError")


for mode in MODES:
    # Same total size, elements laid out differently: the digest alone tells these ranks apart.
    turned = [member(0, (2, 3) if R == 0 else (3, 2)), member(1, (4,))]
    expect_mismatch(
        "[2, 3] against [3, 2]",
        mode,
        turned,
        f"turned.{mode}",
        [f"turned.{mode}.0'", "rank 0: [2, 3]", f"{others}: [3, 2]"],
    )
    sizes = [member(0, (3,)), member(1, (2,) if R == 0 else (5,))]
    expect_mismatch(
        "member sizes", mode, sizes, f"sizes.{mode}", [f"sizes.{mode}.1'", "rank 0: [2]", f"{others}: [5]"]
    )
    dtyped = [member(0, (3,)), member(1, (2,), np.float32 if R == 0 else np.float64)]
    expect_mismatch(
        "one member's dtype",
        mode,
        dtyped,
        f"dtype.{mode}",
        [f"dtype.{mode}.1'", "rank 0: float32", f"{others}: float64"],
    )
    counted = [member(i, (2,)) for i in range(2 if R == 0 else 3)]
    expect_mismatch(
        "member counts",
        mode,
        counted,
        f"count.{mode}",
        ["numbers of tensors for group 'count", "rank 0: 2", f"{others}: 3"],
    )
    # The process stays usable: the next group and a plain allreduce succeed on every rank.
    out = run(
        mode, lambda: hvd.grouped_allreduce([member(0, (2,)), member(1, (1,))], op=hvd.Sum, name=f"after.{mode}")
    )
    same(f"{mode} after the errors", out[1], summed(1, (1,)))
same(
    "plain allreduce after the errors",
    hvd.allreduce(np.float32(R), op=hvd.Sum, name="last").numpy(),
    np.float32(sum(range(N))),
)
