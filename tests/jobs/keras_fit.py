"""model.fit with DistributedOptimizer against one process on the global batch, with Horovod's callbacks, for
several steps_per_execution and eagerly; sparse Embedding gradients inside fit."""

import keras
import numpy as np
from keras_common import LOSS, B, N, R, assert_same_everywhere, data, flat, hvd, mlp, shard

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
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1 if R == 0 else 0.7, momentum=0.9)),
        loss=LOSS,
        steps_per_execution=steps_per_execution,
        run_eagerly=run_eagerly,
    )
    raw, averaged = Record(), Record()
    model.fit(
        shard(x, STEPS),
        shard(y, STEPS),
        batch_size=B,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=(vx, vy),
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            raw,
            hvd.callbacks.MetricAverageCallback(),
            averaged,
        ],
    )
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
    return keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(20, 4),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )


for sparse_as_dense in (False, True):
    model, ref = embedding_model(), embedding_model()
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.2), sparse_as_dense=sparse_as_dense), loss="mse"
    )
    model.fit(shard(ids, STEPS), shard(target, STEPS), batch_size=B, epochs=1, shuffle=False, verbose=0)
    ref.compile(optimizer=keras.optimizers.SGD(0.2), loss="mse")
    ref.fit(ids, target, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    assert_same_everywhere(flat(model), f"embedding{sparse_as_dense}")
    assert np.allclose(flat(model), flat(ref), atol=1e-5), np.abs(flat(model) - flat(ref)).max()
