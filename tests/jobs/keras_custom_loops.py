"""Custom training loops with DistributedOptimizer against one process on the global batch: gradient accumulation
(also inside model.fit), bounded staleness, elastic commits, PowerSGD and top-k with error feedback and the trial
that decides on compression, local SGD, averaged optimizer state, Sum, LossScaleOptimizer and mixed_float16,
local layers, and SyncBatchNormalization."""

import time
import zlib

import keras
import numpy as np
import tensorflow as tf
from keras_common import LOSS, B, N, R, assert_same_everywhere, data, flat, hvd, mlp, shard

import hvdlite.tensorflow as hvd_tf
import hvdlite.tensorflow.keras.elastic as hvd_elastic

STEPS = 4
x, y = data(2 * STEPS)
xs, ys = shard(x, 2 * STEPS), shard(y, 2 * STEPS)


def custom_loop(model, opt, rows_x, rows_y, graph, passes=1):
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step = tf.function(step) if graph else step
    rows = len(rows_y) // (STEPS * passes)
    for i in range(STEPS * passes):
        step(tf.constant(rows_x[i * rows : (i + 1) * rows]), tf.constant(rows_y[i * rows : (i + 1) * rows]))


def reference(make_opt, passes=1):
    """One process on the global batches: STEPS updates, each from `passes` global micro-batches."""
    ref = mlp(0)
    ref_opt = make_opt()
    if passes == 1:
        custom_loop(ref, ref_opt, x[: STEPS * N * B], y[: STEPS * N * B], True)
    else:  # the mean gradient of `passes` global micro-batches per update
        for i in range(STEPS):
            with tf.GradientTape() as tape:
                loss = (
                    tf.add_n(
                        [
                            LOSS(y[j * N * B : (j + 1) * N * B], ref(x[j * N * B : (j + 1) * N * B]))
                            for j in range(i * passes, (i + 1) * passes)
                        ]
                    )
                    / passes
                )
            ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
    return flat(ref)


def sgd():
    return keras.optimizers.SGD(0.1, momentum=0.9)


def lso():
    return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=256.0)


for graph in (True, False):
    for name, make_opt, kwargs in (
        ("sgd", sgd, {}),
        ("lso", lso, {}),
        ("predivide", sgd, {"gradient_predivide_factor": 2.0}),
        ("fp16", sgd, {"compression": hvd.Compression.fp16}),
        ("groups", sgd, {"num_groups": 2}),
    ):
        model = mlp(0)
        opt = hvd.DistributedOptimizer(make_opt(), **kwargs)
        custom_loop(model, opt, xs[: STEPS * B], ys[: STEPS * B], graph)
        ref = reference(make_opt)
        w = flat(model)
        assert_same_everywhere(w, f"{name}{graph}")
        tolerance = 2e-3 if name == "fp16" else 1e-5
        assert np.abs(w - ref).max() < tolerance, (name, graph, np.abs(w - ref).max())
    # backward_passes_per_step: local sums over 2 passes, one allreduce and one update per 2 calls
    model = mlp(0)
    opt = hvd.DistributedOptimizer(sgd(), backward_passes_per_step=2, average_aggregated_gradients=True)
    custom_loop(model, opt, xs, ys, graph, passes=2)
    w = flat(model)
    assert_same_everywhere(w, f"accumulate{graph}")
    ref = reference(sgd, passes=2)
    assert np.abs(w - ref).max() < 1e-5, (graph, np.abs(w - ref).max())
    assert int(opt.iterations.numpy()) == 2 * STEPS  # Horovod counts every backward pass

# ... and inside model.fit, where the tf.cond runs in the tf.while_loop of steps_per_execution
model = mlp(0)
model.compile(
    optimizer=hvd.DistributedOptimizer(sgd(), backward_passes_per_step=2, average_aggregated_gradients=True),
    loss=LOSS,
    steps_per_execution=4,
)
model.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
assert_same_everywhere(flat(model), "accumulate fit")
assert np.abs(flat(model) - reference(sgd, passes=2)).max() < 1e-5

# Bounded staleness (s = 2), in a tf.function and eagerly: update t applies the global gradient of step t - 2
# (the first two apply nothing), drain() applies the last two, and model.fit runs with it.
S = 2
for graph in (True, False):
    model, ref = mlp(0), mlp(0)
    opt = hvd.DistributedOptimizer(sgd(), staleness=S)
    ref_opt, queue = sgd(), []

    def stale_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    stale_step = tf.function(stale_step) if graph else stale_step
    for i in range(6):
        before = flat(model)
        stale_step(tf.constant(xs[i * B : (i + 1) * B]), tf.constant(ys[i * B : (i + 1) * B]))
        with tf.GradientTape() as tape:
            loss = LOSS(y[i * N * B : (i + 1) * N * B], ref(x[i * N * B : (i + 1) * N * B]))
        queue.append(tape.gradient(loss, ref.trainable_variables))
        if len(queue) > S:
            ref_opt.apply_gradients(zip(queue.pop(0), ref.trainable_variables))
        if i < S:
            assert np.array_equal(flat(model), before), f"step {i} had nothing to apply yet"
        assert np.abs(flat(model) - flat(ref)).max() < 1e-5, (graph, i, np.abs(flat(model) - flat(ref)).max())
    assert opt.drain() == S and opt.drain() == 0
    for g in queue:
        ref_opt.apply_gradients(zip(g, ref.trainable_variables))
    assert np.abs(flat(model) - flat(ref)).max() < 1e-5, (graph, "drained")
    assert_same_everywhere(flat(model), f"stale{graph}")
# Elastic: a commit holds the averages in flight; after a restore the same steps give the same weights.

model = mlp(0)
opt = hvd.DistributedOptimizer(sgd(), staleness=S)


def stale_steps(first, last):
    seen = []
    for i in range(first, last):
        with tf.GradientTape() as tape:
            loss = LOSS(ys[i * B : (i + 1) * B], model(xs[i * B : (i + 1) * B], training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        seen.append(flat(model))
    return seen


stale_steps(0, 4)
state = hvd_elastic.KerasState(model, opt)
first = stale_steps(4, 7)
state.restore()
again = stale_steps(4, 7)
assert all(np.array_equal(a, b) for a, b in zip(first, again)), "the restored averages in flight differ"
model = mlp(0)
model.compile(optimizer=hvd.DistributedOptimizer(sgd(), staleness=1), loss=LOSS)
model.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
assert model.optimizer.drain() == 1
assert_same_everywhere(flat(model), "stale fit")
for bad in (0, 1.5):
    try:
        hvd.DistributedOptimizer(sgd(), staleness=bad)
    except ValueError as e:
        assert "staleness must be an integer >= 1" in str(e), e
    else:
        raise SystemExit(f"staleness={bad} was accepted")

# PowerSGD and top-k with error feedback: gradients given directly (every rank's known to every rank), plain SGD
# with lr 1, so each update is minus the exchanged gradient; a written-out reference runs the method over all
# ranks' gradients. The first START updates are uncompressed; of mlp's kernels, PowerSGD compresses the first.

START, UPDATES = 2, 6


def given(rank, step, i, shape):
    return np.random.default_rng(zlib.crc32(f"{rank}.{step}.{i}".encode())).standard_normal(shape).astype("float32")


def apply_given(opt, model, first, last):
    """Applies this rank's given gradients of steps first to last - 1 through opt; the weights after each."""
    variables = model.trainable_variables
    seen = []
    for step in range(first, last):
        opt.apply_gradients(
            zip([tf.constant(given(R, step, i, tuple(v.shape))) for i, v in enumerate(variables)], variables)
        )
        seen.append(flat(model))
    return seen


def powersgd_reference(shapes, r=2):
    residuals, qs, out = {}, {}, []
    for step in range(1, UPDATES + 1):
        reduced = []
        for i, shape in enumerate(shapes):
            gs = [given(rank, step, i, shape) for rank in range(N)]
            n, m = shape[0], int(np.prod(shape[1:]))
            if step <= START or len(shape) < 2 or (n + m) * min(r, n, m) * 2 > n * m:
                reduced.append(sum(gs) / N)
                continue
            ms = [g.reshape(n, m) + residuals.get((rank, i), 0) for rank, g in enumerate(gs)]
            q = qs.get(i)
            if q is None:
                q = np.random.default_rng(zlib.crc32(f"0:{i}:0".encode())).standard_normal((m, r)).astype("float32")
            p = np.linalg.qr(sum(mm @ q for mm in ms) / N)[0]
            qs[i] = sum(mm.T @ p for mm in ms) / N
            approximation = p @ qs[i].T
            for rank, mm in enumerate(ms):
                residuals[rank, i] = mm - approximation
            reduced.append(approximation.reshape(shape))
        out.append(reduced)
    return out


def topk_reference(shapes, ratio=0.1):
    residuals, out = {}, []
    for step in range(1, UPDATES + 1):
        reduced = []
        for i, shape in enumerate(shapes):
            gs = [given(rank, step, i, shape) for rank in range(N)]
            size = int(np.prod(shape))
            k = int(np.ceil(ratio * size))
            if step <= START or len(shape) < 2 or 2 * k * 2 > size:
                reduced.append(sum(gs) / N)
                continue
            dense = np.zeros(size, "float32")
            for rank, g in enumerate(gs):
                total = g.reshape(-1) + residuals.get((rank, i), 0)
                index = np.argsort(-np.abs(total))[:k]
                dense[index] += total[index]
                total = total.copy()
                total[index] = 0
                residuals[rank, i] = total
            reduced.append((dense / N).reshape(shape))
        out.append(reduced)
    return out


METHODS = (
    ("powersgd", lambda: hvd.Compression.powersgd(rank=2, start_iter=START), powersgd_reference),
    ("topk", lambda: hvd.Compression.topk(ratio=0.1, start_iter=START), topk_reference),
)
for kind, make, reference_of in METHODS:
    for graph in (True, False):
        model = mlp(0)
        variables = model.trainable_variables
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=make())

        def update(grads):
            opt.apply_gradients(zip(grads, variables))

        update = tf.function(update) if graph else update
        expected = [v.numpy().copy() for v in variables]
        for step, reduced in enumerate(reference_of([tuple(v.shape) for v in variables]), start=1):
            update([tf.constant(given(R, step, i, tuple(v.shape))) for i, v in enumerate(variables)])
            expected = [e - r for e, r in zip(expected, reduced)]
            worst = max(np.abs(v.numpy() - e).max() for v, e in zip(variables, expected))
            assert worst < 1e-4, (kind, graph, step, worst)
        assert_same_everywhere(flat(model), f"{kind}{graph}")
    # Elastic: a commit holds the residuals, step count and warm starts; after a restore the same updates give
    # the same weights.
    model = mlp(0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=make())

    def updates(first, last):
        return apply_given(opt, model, first, last)

    updates(1, 5)
    state = hvd_elastic.KerasState(model, opt)
    first = updates(5, 8)
    state.restore()
    assert all(np.array_equal(a, b) for a, b in zip(first, updates(5, 8))), f"{kind}: the restored state differs"
    # model.fit with it, and what it refuses
    model = mlp(0)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(), compression=make()), loss=LOSS)
    model.fit(xs, ys, batch_size=B, epochs=2, shuffle=False, verbose=0)
    assert_same_everywhere(flat(model), f"{kind} fit")
    for bad in ({"staleness": 1}, {"gradient_predivide_factor": 2.0}):
        try:
            hvd.DistributedOptimizer(sgd(), compression=make(), **bad)
        except ValueError as e:
            assert "cannot be combined" in str(e), e
        else:
            raise SystemExit(f"{kind} with {bad} was accepted")
try:
    hvd.Compression.powersgd(rank=0)
except ValueError as e:
    assert "rank must be >= 1" in str(e), e
else:
    raise SystemExit("powersgd(rank=0) was accepted")
# Trials that find compression not worth it: every rank stops compressing after them, and every update applied, in
# the trial too, is the plain average of what was given. In the first, a sleep in the exchange on every rank stands
# in for a slow link in the timed uncompressed updates, so an update without that wait could be about 2x shorter
# and the trial times its compressed updates (applying the exact average); rank 1 sleeps in those, so they are not
# shorter. In the second, rank 1 sleeps in every update: rank 0 waits for it, but the exchange itself keeps neither
# waiting, and a compressed exchange would not make rank 1 faster, so the trial says no before compressing any.

for make, slow_link, slow_updates, compressed_half in (
    (
        lambda: hvd.Compression.powersgd(rank=2, start_iter=4, min_step_speedup=1.2, trial_steps=2),
        (3, 4),
        range(5, 9),
        True,
    ),
    (
        lambda: hvd.Compression.topk(ratio=0.1, start_iter=1, min_step_speedup=1.2, trial_steps=2),
        (),
        range(2, 9),
        False,
    ),
):
    model = mlp(0)
    variables = model.trainable_variables
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=make())
    feedback = opt._hvd().feedback
    finish, current = feedback._finish_plain, [0]

    def finish_over_a_slow_link(*args):
        if current[0] in slow_link:
            time.sleep(0.4)
        return finish(*args)

    feedback._finish_plain = finish_over_a_slow_link
    start = [v.numpy().copy() for v in variables]
    total = [np.zeros(v.shape, "float32") for v in variables]
    for step in range(1, 9):
        current[0] = step
        if R == 1 and step in slow_updates:
            time.sleep(0.4)
        grads = [given(R, step, i, tuple(v.shape)) for i, v in enumerate(variables)]
        opt.apply_gradients(zip([tf.constant(g) for g in grads], variables))
        for i, (t, v) in enumerate(zip(total, variables)):
            t += sum(given(r, step, i, tuple(v.shape)) for r in range(N)) / N
        worst = max(np.abs(v.numpy() - (s - t)).max() for v, s, t in zip(variables, start, total))
        assert worst < 1e-4, (step, worst, feedback.trial.state())
    state = feedback.trial.state()
    assert feedback.trial.decision is False and feedback.residuals == {}, state
    assert (state["compressed_seconds"] is not None) == compressed_half, state
    assert state["plain_seconds"] > 0.3 and 0 < state["work_seconds"] < 0.3, state  # the rehearsal, timed
    if compressed_half:
        assert 0.3 < state["waited_seconds"] < state["plain_seconds"], state
    else:  # the least wait over the ranks: rank 1's, which did not wait for rank 0
        assert state["waited_seconds"] < 0.1, state
    assert feedback.last_dense_bytes > 0 and feedback.shared_state()["trial"]["decision"] is False
    assert_same_everywhere(flat(model), "after the trial")
# The rehearsal of a compressed exchange (on the trial's last uncompressed update) keeps nothing: no residual, no
# warm start, the update's byte count that of its plain exchange, and the update applied the plain average.
model = mlp(0)
variables = model.trainable_variables
opt = hvd.DistributedOptimizer(
    keras.optimizers.SGD(1.0),
    compression=hvd.Compression.powersgd(rank=2, start_iter=4, min_step_speedup=1.2, trial_steps=2),
)
feedback = opt._hvd().feedback
start = [v.numpy().copy() for v in variables]
for step in range(1, 5):
    opt.apply_gradients(
        zip([tf.constant(given(R, step, i, tuple(v.shape))) for i, v in enumerate(variables)], variables)
    )
assert feedback.trial.trial_from == 4 and feedback.trial.work_seconds > 0, feedback.trial.state()
assert feedback.residuals == {} and feedback.qs == {}, (feedback.residuals.keys(), feedback.qs.keys())
assert feedback.last_dense_bytes == sum(int(np.prod(v.shape)) * 4 for v in variables)
expected = [
    s - sum(given(r, step, i, tuple(v.shape)) for r in range(N) for step in range(1, 5)) / N
    for i, (s, v) in enumerate(zip(start, variables))
]
assert max(np.abs(v.numpy() - e).max() for v, e in zip(variables, expected)) < 1e-4


# Local SGD (sync_every=2 after 1 synchronous update): each rank applies its own given gradients and the weights
# are averaged every 2 updates, plainly and through an outer Nesterov step; a reference follows every rank.
def local_sgd_reference(shapes, start, k=2, warmup=1, lr=0.1, outer_lr=1.0, outer_momentum=0.0):
    weights = [[w.copy() for w in start] for _ in range(N)]
    anchor, velocity, out = None, None, []
    for step in range(1, UPDATES + 1):
        for rank in range(N):
            for i, shape in enumerate(shapes):
                if step <= warmup:
                    weights[rank][i] = weights[rank][i] - lr * sum(given(q, step, i, shape) for q in range(N)) / N
                else:
                    weights[rank][i] = weights[rank][i] - lr * given(rank, step, i, shape)
        outer = outer_lr != 1.0 or outer_momentum != 0.0
        if step == warmup and outer:
            anchor = [w.copy() for w in weights[0]]
        if step > warmup and (step - warmup) % k == 0:
            mean = [sum(weights[q][i] for q in range(N)) / N for i in range(len(shapes))]
            if outer and anchor is None:
                anchor = [m.copy() for m in mean]
            elif outer:
                velocity = velocity or [np.zeros_like(a) for a in anchor]
                for i in range(len(shapes)):
                    gradient = anchor[i] - mean[i]
                    velocity[i] = outer_momentum * velocity[i] + gradient
                    anchor[i] = anchor[i] - outer_lr * (gradient + outer_momentum * velocity[i])
                mean = [a.copy() for a in anchor]
            weights = [[m.copy() for m in mean] for _ in range(N)]
        out.append([w.copy() for w in weights[R]])
    return out


for outer in ({}, {"outer_lr": 0.7, "outer_momentum": 0.5}):
    for graph in (True, False):
        model = mlp(0)
        variables = model.trainable_variables
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), sync_every=2, sync_warmup_steps=1, **outer)

        def update(grads):
            opt.apply_gradients(zip(grads, variables))

        update = tf.function(update) if graph else update
        shapes = [tuple(v.shape) for v in variables]
        for step, expected in enumerate(local_sgd_reference(shapes, [v.numpy() for v in variables], **outer), 1):
            update([tf.constant(given(R, step, i, shape)) for i, shape in enumerate(shapes)])
            worst = max(np.abs(v.numpy() - e).max() for v, e in zip(variables, expected))
            assert worst < 1e-5, ("local sgd", outer, graph, step, worst)
            if step > 1 and (step - 1) % 2 == 0:
                assert_same_everywhere(flat(model), f"local sgd {outer} {graph} {step}")
# Momentum averaged with the weights (average_optimizer_state), an elastic restore, fit, and what it refuses
model = mlp(0)
variables = model.trainable_variables
opt = hvd.DistributedOptimizer(sgd(), sync_every=3, average_optimizer_state=True)


def local_updates(first, last):
    return apply_given(opt, model, first, last)


local_updates(1, 4)
momenta = [v.numpy() for v in opt.variables if tuple(v.shape) == tuple(variables[0].shape)]
assert momenta and not np.allclose(momenta[0], 0), "no momentum to average"
assert_same_everywhere(np.concatenate([m.ravel() for m in momenta]), "averaged momentum")
state = hvd_elastic.KerasState(model, opt)
first = local_updates(4, 9)
state.restore()
assert all(np.array_equal(a, b) for a, b in zip(first, local_updates(4, 9))), "local sgd: the restored state differs"
model = mlp(0)
model.compile(optimizer=hvd.DistributedOptimizer(sgd(), sync_every=2), loss=LOSS)
model.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)  # 8 updates: the last one averages
assert_same_everywhere(flat(model), "local sgd fit")
for bad, message in (
    ({"op": hvd.Sum}, "needs op=Average"),
    ({"staleness": 1}, "cannot be combined"),
    ({"compression": hvd.Compression.topk()}, "cannot be combined"),
    ({"sync_every": 0}, "sync_every must be an integer >= 1"),
):
    try:
        hvd.DistributedOptimizer(sgd(), **dict({"sync_every": 2}, **bad))
    except ValueError as e:
        assert message in str(e), (bad, e)
    else:
        raise SystemExit(f"local SGD with {bad} was accepted")


with tf.GradientTape() as tape:
    pass
try:
    hvd_tf.DistributedGradientTape(tape, compression=hvd_tf.Compression.topk())
except ValueError as e:
    assert "works with hvdlite.tensorflow.keras.DistributedOptimizer" in str(e), e
else:
    raise SystemExit("DistributedGradientTape took top-k compression")

# Sum instead of Average: N times the average step with plain SGD
model, ref = mlp(0), mlp(0)
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum)
g = [tf.ones_like(v) * (R + 1) for v in model.trainable_variables]
opt.apply_gradients(zip(g, model.trainable_variables))
assert np.allclose(flat(model), flat(ref) - 0.1 * sum(r + 1 for r in range(N)), atol=1e-6)

# LossScaleOptimizer: an overflow on ONE rank makes every rank skip the step and halve the scale together
for graph in (False, True):
    model = mlp(0)
    opt = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=64.0))
    opt.build(model.trainable_variables)

    def apply(poison):
        g = [tf.ones_like(v) for v in model.trainable_variables]
        g[0] = g[0] * poison
        opt.apply(g, model.trainable_variables)

    apply = tf.function(apply) if graph else apply
    before = flat(model)
    apply(tf.constant(np.inf if R == 1 else 1.0, tf.float32))
    assert np.array_equal(flat(model), before), "a rank applied an overflowing step"
    assert float(opt.dynamic_scale.numpy()) == 32.0
    apply(tf.constant(1.0))
    assert np.allclose(flat(model), before - 0.1 / 32.0, atol=1e-7)
    assert_same_everywhere(flat(model), f"lso{graph}")

# mixed_float16: DistributedOptimizer puts the LossScaleOptimizer inside (before compile would put it outside)
keras.mixed_precision.set_global_policy("mixed_float16")
model = mlp(0)
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
model.compile(optimizer=opt, loss=LOSS)
assert model.optimizer is opt
model.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
assert_same_everywhere(flat(model), "mixed")
keras.mixed_precision.set_global_policy("float32")

# Partial: a local layer keeps its own gradient (scaled by 1/size)
model = mlp(0)
opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[model.layers[1]])
model.compile(optimizer=opt, loss=LOSS)
model.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
shared = np.concatenate([w.ravel() for w in model.layers[0].get_weights()])
local = np.concatenate([w.ravel() for w in model.layers[1].get_weights()])
assert_same_everywhere(shared, "partial shared")
assert len({e.tobytes() for e in hvd.allgather_object(local)}) == N, "local layer was synchronised"

# SyncBatchNormalization: the statistics and the gradient of the global batch
keras.utils.set_random_seed(5)
full = np.random.default_rng(5).normal(size=(N * 3, 4, 4, 2)).astype("float32") * 3 + 1
weights = np.arange(full.size, dtype="float32").reshape(full.shape) / full.size
bn, sync = keras.layers.BatchNormalization(), hvd.SyncBatchNormalization()
bn.build(full.shape)
sync.build(full.shape)
xg, xl = tf.constant(full), tf.constant(full[R * 3 : (R + 1) * 3])
with tf.GradientTape() as tape:
    tape.watch(xg)
    out_ref = bn(xg, training=True)
    loss_ref = tf.reduce_sum(out_ref * weights)
grad_ref = tape.gradient(loss_ref, xg)


@tf.function
def sync_step(xl):
    with tf.GradientTape() as tape:
        tape.watch(xl)
        out = sync(xl, training=True)
        loss = tf.reduce_sum(out * weights[R * 3 : (R + 1) * 3])
    return out, tape.gradient(loss, xl)


out, grad = sync_step(xl)
mine = out_ref.numpy()[R * 3 : (R + 1) * 3]
assert np.allclose(out.numpy(), mine, atol=1e-4), np.abs(out.numpy() - mine).max()
assert np.allclose(grad.numpy(), grad_ref.numpy()[R * 3 : (R + 1) * 3], atol=1e-4)
assert np.allclose(sync.moving_mean.numpy(), bn.moving_mean.numpy(), atol=1e-5)
assert np.allclose(sync.moving_variance.numpy(), bn.moving_variance.numpy(), atol=1e-4)

try:
    hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
except ValueError as e:
    assert "Keras 3 optimizer" in str(e)
else:
    raise SystemExit("a non-Keras optimizer was accepted")
