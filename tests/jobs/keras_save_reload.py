"""Saving and reloading a model trained with DistributedOptimizer (a plain Keras process reloads it; hvd.load_model
brings the optimizer back distributed), LearningRateWarmupCallback, LearningRateScheduleCallback with momentum
correction, and the errors of jit_compile=True and of ranks with different models. argv[1]: the model's path."""

import subprocess
import sys
import zipfile

import keras
import numpy as np
import tensorflow as tf
from keras_common import LOSS, B, N, R, assert_same_everywhere, data, flat, hvd, mlp, shard

PATH = sys.argv[1]
STEPS = 4
x, y = data(STEPS)
model = mlp(100 + R)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss=LOSS)
model.fit(
    shard(x, STEPS),
    shard(y, STEPS),
    batch_size=B,
    epochs=1,
    shuffle=False,
    verbose=0,
    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
)
if R == 0:
    model.save(PATH)
    config = zipfile.ZipFile(PATH).read("config.json").decode()
    assert "hvdlite" not in config and '"SGD"' in config, config
    # A plain Keras process, where hvdlite cannot even be imported, reloads it.
    check = (
        f"import sys; sys.modules['hvdlite'] = None\n"
        f"import numpy as np, keras\n"
        f"m = keras.models.load_model({PATH!r})\n"
        f"assert type(m.optimizer) is keras.optimizers.SGD, type(m.optimizer)\n"
        f"assert int(m.optimizer.iterations.numpy()) == {STEPS}\n"
        f"np.save({PATH + '.npy'!r}, np.concatenate([w.ravel() for w in m.get_weights()]))\n"
    )
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
history = model.fit(
    shard(x, STEPS),
    shard(y, STEPS),
    batch_size=B,
    epochs=3,
    shuffle=False,
    verbose=0,
    callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), log],
)
expected = [0.4 / N * ((e + b / STEPS + 1 / STEPS) * (N - 1) / 2 + 1) for e in range(2) for b in range(STEPS)]
assert np.allclose(log.seen[: 2 * STEPS], expected, atol=1e-6), (log.seen, expected)
assert np.allclose(log.seen[2 * STEPS :], 0.4, atol=1e-6), log.seen
assert np.allclose(history.history["lr"][-1], 0.4)

# LearningRateScheduleCallback (staircase) with momentum correction: the velocity is rescaled with the rate
model = mlp(0)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.2, momentum=0.9)), loss=LOSS)
model.fit(shard(x, STEPS), shard(y, STEPS), batch_size=B, epochs=1, shuffle=False, verbose=0)
schedule = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=lambda e: 0.5**e, start_epoch=1)
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
