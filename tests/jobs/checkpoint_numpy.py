"""A framework-free job for tests/test_checkpoints.py (it starts in a fraction of a second, so a test can kill and
restart it many times): linear regression by SGD with momentum in float64 under hvdlite's framework-neutral
elastic run, the weights, the momentum and the position in the data kept as plain attributes of an elastic State,
checkpointed through hvdlite-run's --checkpoint-dir. Deterministic, so an interrupted and resumed run ends with
the same weights, bit for bit, as one that was never interrupted.

argv: OUT_DIR. Rank 0 prints "START <step>" when train() begins (the step it resumed from) and "STEP <n>" after
each committed step, and at the end writes the final weights to OUT_DIR/weights.json.

PAUSE_AT="<step> before|after" (environment): rank 0 stops itself (SIGSTOP) at that step, before or after its
commit, for the test to kill the whole job there."""

import json
import os
import signal
import sys

import numpy as np
from numpy_collectives import allreduce, broadcast_object

from hvdlite.common import basics
from hvdlite.common.elastic import State, run_fn

EPOCHS, SAMPLES, BATCH = 10, 48, 4  # 2 ranks: 6 steps an epoch, 60 in all

out_dir = sys.argv[1]
pause_step, pause_where = os.environ.get("PAUSE_AT", "0 none").split()

basics.init()
rank, size = basics.rank(), basics.size()
data_rng = np.random.default_rng(0)
features = data_rng.standard_normal((SAMPLES, 8))
targets = np.sin(features.sum(axis=1))


def say(text):
    if rank == 0:
        print(text, flush=True)


def pause_here(step, where):
    if rank == 0 and where == pause_where and step >= int(pause_step):
        os.kill(os.getpid(), signal.SIGSTOP)


def my_batches(epoch):
    """This rank's batches of the epoch: a shuffle every rank computes alike, split by rank."""
    order = np.random.default_rng(7 + epoch).permutation(SAMPLES)[rank::size]
    return [order[i : i + BATCH] for i in range(0, len(order), BATCH)]


def reset():
    basics.shutdown()
    basics.init()


def train(state):
    say(f"START {state.step}")
    while state.epoch < EPOCHS:
        batches = my_batches(state.epoch)
        while state.batch < len(batches):
            rows = batches[state.batch]
            error = features[rows] @ state.weights - targets[rows]
            gradient = allreduce(features[rows].T @ error / len(rows), "gradient") / size
            state.velocity = 0.9 * state.velocity + gradient
            state.weights = state.weights - 0.05 * state.velocity
            state.batch += 1
            state.step += 1
            pause_here(state.step, "before")
            state.commit()
            pause_here(state.step, "after")
            say(f"STEP {state.step}")
        state.epoch, state.batch = state.epoch + 1, 0
        state.commit()


train = run_fn(train, reset)
state = State(broadcast_object, basics.rank, weights=np.zeros(8), velocity=np.zeros(8), epoch=0, batch=0, step=0)
train(state)
if rank == 0:
    with open(os.path.join(out_dir, "weights.json"), "w") as f:
        json.dump({"step": state.step, "weights": state.weights.tolist()}, f)
basics.shutdown()
