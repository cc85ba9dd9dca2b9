"""A job for tests/test_checkpoints.py: Keras fit under hvd.elastic.run with KerasState, checkpoints written to the
directory given to ``hvd.elastic.run(checkpoint_dir=...)``. The state is committed at the end of every epoch only:
fit starts an epoch from its first batch, so a resumed fit goes on exactly where the last commit left it.

argv: OUT_DIR CHECKPOINT_DIR. Rank 0 prints "START <epoch>" when train() begins and "EPOCH <n>" after each
committed epoch, and at the end writes the final weights to OUT_DIR/weights.json. PAUSE_AT="<epoch> <batch>"
(environment): rank 0 stops itself (SIGSTOP) after that batch, for the test to kill the whole job there."""

import json
import os
import signal
import sys

import keras
import numpy as np

import hvdlite.tensorflow.keras as hvd

EPOCHS = 6

out_dir, checkpoint_dir = sys.argv[1], sys.argv[2]
pause_at = tuple(int(n) for n in os.environ.get("PAUSE_AT", "-1 -1").split())
hvd.init()
rng = np.random.default_rng(5)
features = rng.normal(size=(64, 8)).astype("float32")
targets = np.sin(features.sum(axis=1, keepdims=True)).astype("float32")
keras.utils.set_random_seed(11)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")


def say(text):
    if hvd.rank() == 0:
        print(text, flush=True)


class Progress(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if hvd.rank() == 0 and (state.epoch, batch) == pause_at:
            os.kill(os.getpid(), signal.SIGSTOP)

    def on_epoch_end(self, epoch, logs=None):
        say(f"EPOCH {state.epoch}")


@hvd.elastic.run(checkpoint_dir=checkpoint_dir)
def train(state):
    say(f"START {state.epoch}")
    shard = slice(hvd.rank(), None, hvd.size())
    # The state callbacks first, so that the epoch-end commit holds the finished epoch's number.
    model.fit(
        features[shard],
        targets[shard],
        batch_size=8,
        epochs=EPOCHS - state.epoch,
        shuffle=False,
        verbose=0,
        callbacks=[
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            hvd.elastic.CommitStateCallback(state, batches_per_commit=10**9),
            Progress(),
        ],
    )


state = hvd.elastic.KerasState(model, epoch=0, batch=0)
train(state)
if hvd.rank() == 0:
    weights = np.concatenate([w.ravel() for w in model.get_weights()]).tolist()
    with open(os.path.join(out_dir, "weights.json"), "w") as f:
        json.dump({"epoch": state.epoch, "weights": weights}, f)
