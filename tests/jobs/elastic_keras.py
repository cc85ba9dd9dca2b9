"""A worker of an elastic Keras job (tests/test_elastic.py): model.fit under hvd.elastic.run with KerasState and
the state callbacks. argv: OUT_DIR EPOCHS. Logs JSON lines to OUT_DIR/<worker id>.log like elastic_train.py."""

import json
import os
import sys
import time

import keras
import numpy as np

import hvdlite.tensorflow.keras as hvd

out_dir, epochs = sys.argv[1], int(sys.argv[2])
worker = os.environ.get("HVDLITE_WORKER_ID", "plain")


def log(**event):
    with open(os.path.join(out_dir, f"{worker}.log"), "a") as f:
        f.write(json.dumps(dict(event, pid=os.getpid(), time=time.time())) + "\n")


log(event="start")
hvd.init()
rng = np.random.default_rng(3)
features = rng.normal(size=(960, 8)).astype("float32")
targets = (features @ np.arange(1.0, 9.0, dtype="float32")[:, None] + 0.5).astype("float32")
keras.utils.set_random_seed(hvd.rank())  # different on purpose: state.sync() makes the models equal
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
sizes = []


class EpochLog(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        log(event="epoch", epoch=state.epoch, rank=hvd.rank(), size=hvd.size())
        time.sleep(0.3)


@hvd.elastic.run
def train(state):
    sizes.append(hvd.size())
    shard = slice(hvd.rank(), None, hvd.size())
    model.fit(
        features[shard],
        targets[shard],
        batch_size=16,
        epochs=epochs - state.epoch,
        verbose=0,
        shuffle=False,
        callbacks=[
            hvd.elastic.CommitStateCallback(state, batches_per_commit=5),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            EpochLog(),
        ],
    )


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([lambda: log(event="round", rank=hvd.rank(), size=hvd.size())])
train(state)
weights = np.concatenate([w.ravel() for w in model.get_weights()]).tolist()
log(event="done", rank=hvd.rank(), size=hvd.size(), sizes=sizes, epoch=state.epoch, weights=weights)
