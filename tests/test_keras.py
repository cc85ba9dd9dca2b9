"""hvdlite.tensorflow.keras (Keras 3) across real processes: model.fit and custom loops with DistributedOptimizer
against a single process on the global batch, callbacks, LossScaleOptimizer, saving and reloading, XLA and
mismatch errors, and the examples.

TensorFlow and Keras cost seconds to import per rank, so each test is ONE job running many checks; each job
computes its reference itself and prints DONE.
"""

import os
import sys

import pytest
from multiproc import run_checked, run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMON = """
import os, sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras
import hvdlite.tensorflow.keras as hvd
hvd.init()
R, N = hvd.rank(), hvd.size()
B = 4  # rows per rank per step

def mlp(seed, width=16):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(3)])

def data(steps, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(steps * N * B, 6)).astype("float32"), rng.integers(0, 3, size=steps * N * B)

def shard(a, steps):
    '''Rank R's rows of every global batch: global batch i is rows [i*N*B, (i+1)*N*B).'''
    idx = np.concatenate([np.arange(i * N * B + R * B, i * N * B + (R + 1) * B) for i in range(steps)])
    return a[idx]

def flat(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])

def assert_same_everywhere(values, what):
    everyone = hvd.allgather_object(values, name="check." + what)
    assert all(np.array_equal(e, values) for e in everyone), f"{what}: ranks differ"

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
"""


def run(script, np=2, timeout=150):
    return run_checked(COMMON + script, np, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.timeout(240)
@pytest.mark.parametrize("np", [2, 3])
def test_fit_matches_single_process_with_callbacks(np):
    run(
        """
STEPS, EPOCHS = 6, 2
x, y = data(STEPS)
vx, vy = data(2, seed=R + 10)  # each rank validates on different data: MetricAverageCallback averages

class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []
    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))

for steps_per_execution, run_eagerly in ((1, False), (3, False), (1, True)):
    model = mlp(100 + R)  # different initial weights and learning rates on every rank: the broadcast fixes both
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1 if R == 0 else 0.7, momentum=0.9)),
                  loss=LOSS, steps_per_execution=steps_per_execution, run_eagerly=run_eagerly)
    raw, averaged = Record(), Record()
    model.fit(shard(x, STEPS), shard(y, STEPS), batch_size=B, epochs=EPOCHS, shuffle=False, verbose=0,
              validation_data=(vx, vy),
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), raw,
                         hvd.callbacks.MetricAverageCallback(), averaged])
    ref = mlp(100)  # rank 0's initial weights, trained by one process on the global batches
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=LOSS)
    ref.fit(x, y, batch_size=N * B, epochs=EPOCHS, shuffle=False, verbose=0)
    w = flat(model)
    assert_same_everywhere(w, f"fit{steps_per_execution}{run_eagerly}")
    assert np.allclose(w, flat(ref), atol=1e-5), (steps_per_execution, np.abs(w - flat(ref)).max())
    assert int(model.optimizer.iterations.numpy()) == STEPS * EPOCHS
    everyone_raw = hvd.allgather_object(raw.logs)
    for epoch in range(EPOCHS):
        for key in ("loss", "val_loss"):
            expected = np.mean([r[epoch][key] for r in everyone_raw])
            assert abs(averaged.logs[epoch][key] - expected) < 1e-6, (key, averaged.logs[epoch][key], expected)
    assert len({r[0]["val_loss"] for r in everyone_raw}) == N  # they did differ before averaging
    assert_same_everywhere(np.array([averaged.logs[-1]["val_loss"]]), f"val{steps_per_execution}{run_eagerly}")

# Embedding: sparse (IndexedSlices) gradients are allgathered inside fit
ids = np.random.default_rng(1).integers(0, 20, size=(STEPS * N * B, 3))
target = np.random.default_rng(2).normal(size=(STEPS * N * B, 1)).astype("float32")
def embedding_model():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4), keras.layers.Flatten(),
                             keras.layers.Dense(1)])
for sparse_as_dense in (False, True):
    model, ref = embedding_model(), embedding_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.2), sparse_as_dense=sparse_as_dense),
                  loss="mse")
    model.fit(shard(ids, STEPS), shard(target, STEPS), batch_size=B, epochs=1, shuffle=False, verbose=0)
    ref.compile(optimizer=keras.optimizers.SGD(0.2), loss="mse")
    ref.fit(ids, target, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    assert_same_everywhere(flat(model), f"embedding{sparse_as_dense}")
    assert np.allclose(flat(model), flat(ref), atol=1e-5), np.abs(flat(model) - flat(ref)).max()
print("DONE")
""",
        np=np,
    )


@pytest.mark.timeout(240)
def test_custom_loops_accumulation_slow_link_methods_loss_scaling_and_sync_batch_norm():
    run("""
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
        step(tf.constant(rows_x[i * rows:(i + 1) * rows]), tf.constant(rows_y[i * rows:(i + 1) * rows]))

def reference(make_opt, passes=1):
    '''One process on the global batches: STEPS updates, each from `passes` global micro-batches.'''
    ref = mlp(0)
    ref_opt = make_opt()
    if passes == 1:
        custom_loop(ref, ref_opt, x[:STEPS * N * B], y[:STEPS * N * B], True)
    else:  # the mean gradient of `passes` global micro-batches per update
        for i in range(STEPS):
            with tf.GradientTape() as tape:
                loss = tf.add_n([LOSS(y[j * N * B:(j + 1) * N * B], ref(x[j * N * B:(j + 1) * N * B]))
                                 for j in range(i * passes, (i + 1) * passes)]) / passes
            ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
    return flat(ref)

sgd = lambda: keras.optimizers.SGD(0.1, momentum=0.9)
lso = lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=256.0)
for graph in (True, False):
    for name, make_opt, kwargs in (("sgd", sgd, {}), ("lso", lso, {}),
                                   ("predivide", sgd, {"gradient_predivide_factor": 2.0}),
                                   ("fp16", sgd, {"compression": hvd.Compression.fp16}),
                                   ("groups", sgd, {"num_groups": 2})):
        model = mlp(0)
        opt = hvd.DistributedOptimizer(make_opt(), **kwargs)
        custom_loop(model, opt, xs[:STEPS * B], ys[:STEPS * B], graph)
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
model.compile(optimizer=hvd.DistributedOptimizer(sgd(), backward_passes_per_step=2,
                                                 average_aggregated_gradients=True),
              loss=LOSS, steps_per_execution=4)
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
        stale_step(tf.constant(xs[i * B:(i + 1) * B]), tf.constant(ys[i * B:(i + 1) * B]))
        with tf.GradientTape() as tape:
            loss = LOSS(y[i * N * B:(i + 1) * N * B], ref(x[i * N * B:(i + 1) * N * B]))
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
import hvdlite.tensorflow.keras.elastic as hvd_elastic
model = mlp(0)
opt = hvd.DistributedOptimizer(sgd(), staleness=S)
def stale_steps(first, last):
    seen = []
    for i in range(first, last):
        with tf.GradientTape() as tape:
            loss = LOSS(ys[i * B:(i + 1) * B], model(xs[i * B:(i + 1) * B], training=True))
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
import zlib
START, UPDATES = 2, 6
def given(rank, step, i, shape):
    return np.random.default_rng(zlib.crc32(f"{rank}.{step}.{i}".encode())).standard_normal(shape).astype("float32")

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
    variables = model.trainable_variables
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=make())
    def updates(first, last):
        seen = []
        for step in range(first, last):
            opt.apply_gradients(zip([tf.constant(given(R, step, i, tuple(v.shape))) for i, v in enumerate(variables)],
                                    variables))
            seen.append(flat(model))
        return seen
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
import time
for make, slow_link, slow_updates, compressed_half in (
    (lambda: hvd.Compression.powersgd(rank=2, start_iter=4, min_step_speedup=1.2, trial_steps=2), (3, 4),
     range(5, 9), True),
    (lambda: hvd.Compression.topk(ratio=0.1, start_iter=1, min_step_speedup=1.2, trial_steps=2), (), range(2, 9),
     False),
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
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                               compression=hvd.Compression.powersgd(rank=2, start_iter=4, min_step_speedup=1.2,
                                                                    trial_steps=2))
feedback = opt._hvd().feedback
start = [v.numpy().copy() for v in variables]
for step in range(1, 5):
    opt.apply_gradients(zip([tf.constant(given(R, step, i, tuple(v.shape))) for i, v in enumerate(variables)],
                            variables))
assert feedback.trial.trial_from == 4 and feedback.trial.work_seconds > 0, feedback.trial.state()
assert feedback.residuals == {} and feedback.qs == {}, (feedback.residuals.keys(), feedback.qs.keys())
assert feedback.last_dense_bytes == sum(int(np.prod(v.shape)) * 4 for v in variables)
expected = [s - sum(given(r, step, i, tuple(v.shape)) for r in range(N) for step in range(1, 5)) / N
            for i, (s, v) in enumerate(zip(start, variables))]
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
    seen = []
    for step in range(first, last):
        opt.apply_gradients(zip([tf.constant(given(R, step, i, tuple(v.shape))) for i, v in enumerate(variables)],
                                variables))
        seen.append(flat(model))
    return seen
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
for bad, message in (({"op": hvd.Sum}, "needs op=Average"), ({"staleness": 1}, "cannot be combined"),
                     ({"compression": hvd.Compression.topk()}, "cannot be combined"),
                     ({"sync_every": 0}, "sync_every must be an integer >= 1")):
    try:
        hvd.DistributedOptimizer(sgd(), **dict({"sync_every": 2}, **bad))
    except ValueError as e:
        assert message in str(e), (bad, e)
    else:
        raise SystemExit(f"local SGD with {bad} was accepted")

import hvdlite.tensorflow as hvd_tf
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
bn.build(full.shape); sync.build(full.shape)
xg, xl = tf.constant(full), tf.constant(full[R * 3:(R + 1) * 3])
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
        loss = tf.reduce_sum(out * weights[R * 3:(R + 1) * 3])
    return out, tape.gradient(loss, xl)
out, grad = sync_step(xl)
mine = out_ref.numpy()[R * 3:(R + 1) * 3]
assert np.allclose(out.numpy(), mine, atol=1e-4), np.abs(out.numpy() - mine).max()
assert np.allclose(grad.numpy(), grad_ref.numpy()[R * 3:(R + 1) * 3], atol=1e-4)
assert np.allclose(sync.moving_mean.numpy(), bn.moving_mean.numpy(), atol=1e-5)
assert np.allclose(sync.moving_variance.numpy(), bn.moving_variance.numpy(), atol=1e-4)

try:
    hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
except ValueError as e:
    assert "Keras 3 optimizer" in str(e)
else:
    raise SystemExit("a non-Keras optimizer was accepted")
print("DONE")
""")


@pytest.mark.timeout(240)
def test_horovod_options_on_keras3_variables():
    """Horovod options that meet Keras 3: BroadcastGlobalVariablesCallback's local_variables,
    SyncBatchNormalization's fused, PartialDistributedGradientTape on Keras layers (eagerly and in a
    tf.function), and horovod.tensorflow's _executing_eagerly."""
    run("""
import hvdlite.tensorflow as hvd_tf

# BroadcastGlobalVariablesCallback(root_rank, local_variables=...): those variables keep each rank's value; a
# Keras variable may be given as itself or as the TensorFlow variable it holds.
keras.utils.set_random_seed(10 + R)  # a different initialisation on every rank
shared, local = keras.layers.Dense(4, name="shared"), keras.layers.Dense(3, name="local")
model = keras.Sequential([keras.Input((6,)), shared, local])
model.compile(optimizer=keras.optimizers.SGD(0.0), loss=LOSS)  # learning rate 0: only the broadcast changes weights
initial = {v.path: v.numpy() for v in model.weights}
root = hvd.broadcast_object(initial, root_rank=0, name="initial")
x, y = data(1)
callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local.kernel, local.bias.value])
model.fit(shard(x, 1), shard(y, 1), batch_size=B, epochs=1, verbose=0, callbacks=[callback])
for v in model.weights:
    expected = initial[v.path] if any(v is w for w in local.weights) else root[v.path]
    assert np.array_equal(v.numpy(), expected), v.path
assert R == 0 or not np.array_equal(local.kernel.numpy(), root[local.kernel.path])
assert hvd.callbacks.BroadcastGlobalVariablesCallback(0, "", local.kernel).local_variables == [local.kernel]

# SyncBatchNormalization: Keras 3 has no fused kernel; fused=False and None (Keras 2's default) are accepted, also
# from a saved config; fused=True is refused as in Horovod.
batch = tf.constant(np.arange(8 * 3, dtype=np.float32).reshape(8, 3) * (R + 1))
for fused in (False, None):
    layer = hvd.SyncBatchNormalization(fused=fused)
    assert layer(batch, training=True).shape == (8, 3)
    assert hvd.SyncBatchNormalization.from_config(dict(layer.get_config(), fused=fused)) is not None
try:
    hvd.SyncBatchNormalization(fused=True)
except ValueError as e:
    assert "fused=True" in str(e)
else:
    raise SystemExit("fused=True accepted")

# PartialDistributedGradientTape with Keras 3 layers: the local layer's gradient stays local (divided by the
# number of ranks, scale_local_gradients), the others are averaged; eagerly and in a tf.function.
features = tf.constant(shard(x, 1))
def loss_fn():
    return tf.reduce_sum(model(features) ** 2)
with tf.GradientTape() as tape:
    loss = loss_fn()
plain = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
everyone = hvd.allgather_object(plain, name="plain gradients")
for graph in (False, True):
    def distributed():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        tape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=[local])
        return tape.gradient(loss, model.trainable_variables)
    got = (tf.function(distributed) if graph else distributed)()
    for i, (v, g) in enumerate(zip(model.trainable_variables, got)):
        if any(v is w for w in local.weights):
            expected = plain[i] / N
        else:
            expected = np.mean([e[i] for e in everyone], axis=0)
        assert np.allclose(g.numpy(), expected, atol=1e-5), (graph, v.path)

# horovod.tensorflow._executing_eagerly
assert hvd_tf._executing_eagerly() is True
assert not tf.function(lambda: tf.constant(hvd_tf._executing_eagerly()))().numpy()
print("DONE")
""")


@pytest.mark.timeout(240)
def test_save_reload_learning_rate_callbacks_and_errors(tmp_path):
    path = str(tmp_path / "model.keras")
    run(f"""
import subprocess, zipfile
PATH = {path!r}
STEPS = 4
x, y = data(STEPS)
model = mlp(100 + R)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss=LOSS)
model.fit(shard(x, STEPS), shard(y, STEPS), batch_size=B, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
if R == 0:
    model.save(PATH)
    config = zipfile.ZipFile(PATH).read("config.json").decode()
    assert "hvdlite" not in config and '"SGD"' in config, config
    # A plain Keras process, where hvdlite cannot even be imported, reloads it.
    check = (f"import sys; sys.modules['hvdlite'] = None\\n"
             f"import numpy as np, keras\\n"
             f"m = keras.models.load_model({{PATH!r}})\\n"
             f"assert type(m.optimizer) is keras.optimizers.SGD, type(m.optimizer)\\n"
             f"assert int(m.optimizer.iterations.numpy()) == {{STEPS}}\\n"
             f"np.save({{PATH + '.npy'!r}}, np.concatenate([w.ravel() for w in m.get_weights()]))\\n")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(PATH + ".npy"), flat(model))
hvd.broadcast_object(None, root_rank=0, name="saved")

# hvd.load_model: the optimizer comes back with its state, distributed; training continues in step
loaded = hvd.load_model(PATH)
assert isinstance(loaded.optimizer, keras.optimizers.SGD) and type(loaded.optimizer) is not keras.optimizers.SGD
assert int(loaded.optimizer.iterations.numpy()) == STEPS
assert np.array_equal(flat(loaded), flat(model))
x2, y2 = data(STEPS, seed=3)
loaded.fit(shard(x2, STEPS), shard(y2, STEPS), batch_size=B, epochs=1, shuffle=False, verbose=0)
model.fit(shard(x2, STEPS), shard(y2, STEPS), batch_size=B, epochs=1, shuffle=False, verbose=0)
assert_same_everywhere(flat(loaded), "loaded")
assert np.allclose(flat(loaded), flat(model), atol=1e-6)

# LearningRateWarmupCallback: lr grows from lr/size to lr over warmup_epochs, adjusted before every batch
class LrLog(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []
    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(float(self.model.optimizer.learning_rate.numpy()))
model = mlp(0)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.123, momentum=0.9)), loss=LOSS)
log = LrLog()
history = model.fit(shard(x, STEPS), shard(y, STEPS), batch_size=B, epochs=3, shuffle=False, verbose=0,
                    callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), log])
expected = [0.4 / N * ((e + b / STEPS + 1 / STEPS) * (N - 1) / 2 + 1) for e in range(2) for b in range(STEPS)]
assert np.allclose(log.seen[:2 * STEPS], expected, atol=1e-6), (log.seen, expected)
assert np.allclose(log.seen[2 * STEPS:], 0.4, atol=1e-6), log.seen
assert np.allclose(history.history["lr"][-1], 0.4)

# LearningRateScheduleCallback (staircase) with momentum correction: the velocity is rescaled with the rate
model = mlp(0)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.2, momentum=0.9)), loss=LOSS)
model.fit(shard(x, STEPS), shard(y, STEPS), batch_size=B, epochs=1, shuffle=False, verbose=0)
schedule = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=lambda e: 0.5 ** e, start_epoch=1)
schedule.set_model(model)
schedule.on_train_begin()
velocity = [m.numpy().copy() for m in model.optimizer.momentums]
assert any(np.abs(v).max() > 0 for v in velocity)
schedule.on_epoch_begin(1)
schedule.on_train_batch_begin(0)
assert np.isclose(float(model.optimizer.learning_rate.numpy()), 0.1)
for before, after in zip(velocity, model.optimizer.momentums):
    assert np.allclose(after.numpy(), before * 0.5, atol=1e-7)
schedule.on_train_batch_begin(1)  # staircase: once per epoch
assert np.isclose(float(model.optimizer.learning_rate.numpy()), 0.1)

# XLA cannot call the core: fit with jit_compile=True fails clearly on every rank; without it, it trains
model = mlp(0)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS, jit_compile=True)
try:
    model.fit(shard(x, STEPS), shard(y, STEPS), batch_size=B, epochs=1, verbose=0)
except hvd.HvdliteError as e:
    assert isinstance(e, tf.errors.UnimplementedError) and "jit_compile=False" in str(e), str(e)
else:
    raise SystemExit("fit with jit_compile=True trained without synchronisation")
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS, jit_compile=False)
model.fit(shard(x, STEPS), shard(y, STEPS), batch_size=B, epochs=1, verbose=0)
assert_same_everywhere(flat(model), "after xla")

# Ranks with different models: fit fails on every rank with a TensorFlow error carrying hvdlite's message
model = mlp(0, width=16 + R)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS)
try:
    model.fit(shard(x, STEPS), shard(y, STEPS), batch_size=B, epochs=1, verbose=0)
except tf.errors.FailedPreconditionError as e:
    assert isinstance(e, hvd.MismatchError), type(e).__mro__  # fit runs a tf.function: the class survives
    assert "Mismatched shapes for tensor 'DistributedSGD.0.float32'" in str(e), str(e)
    assert "every rank must compute gradients" in str(e), str(e)
else:
    raise SystemExit("mismatched models trained")
assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="after_mismatch")) == N
print("DONE")
""")


@pytest.mark.timeout(300)
def test_examples_keras_mnist_and_synthetic_benchmark(tmp_path):
    import subprocess

    data = tmp_path / "mnist"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "make_mnist_idx.py"),
            "--out",
            str(data),
            "--train",
            "1200",
            "--test",
            "400",
        ],
        check=True,
    )
    checkpoint = tmp_path / "ckpt" / "mnist.keras"
    script = f"""
import runpy, sys
sys.argv = ["keras_mnist.py", "--data-dir", {str(data)!r}, "--epochs", "2", "--checkpoint", {str(checkpoint)!r}]
runpy.run_path({os.path.join(ROOT, "examples", "keras_mnist.py")!r}, run_name="__main__")
"""
    result = run_job(script, np=2, timeout=240, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    accuracy = float(out.split("test accuracy ")[1].split("%")[0])
    assert accuracy > 50.0, out  # ten classes: chance is 10%
    assert out.count("checkpoint written") == 1 and checkpoint.exists(), out  # rank 0 only

    script = f"""
import runpy, sys
sys.argv = ["b", "--model", "small_cnn", "--batch-size", "4", "--image-size", "32", "--num-iters", "2",
            "--num-batches-per-iter", "2", "--num-warmup-batches", "1", "--fp16-allreduce"]
runpy.run_path({os.path.join(ROOT, "examples", "tensorflow2_synthetic_benchmark.py")!r}, run_name="__main__")
"""
    result = run_job(script, np=2, timeout=240, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "total img/sec on 2 rank(s)" in out, out
