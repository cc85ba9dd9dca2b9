"""One worker of the chaos run (bench/chaos.py): a small model trained with hvd.elastic, in PyTorch or in Keras
(`fit` with the elastic callbacks), its state committed at every step and written to hvdlite-run's
--checkpoint-dir, so that a worker lost mid-round rolls back to the last commit and a job killed whole resumes from
the last checkpoint.

argv: FRAMEWORK OUT_DIR MAX_EPOCHS, FRAMEWORK torch or keras. The job trains until OUT_DIR/stop exists, then to the
end of that epoch (at most MAX_EPOCHS). Every worker appends JSON lines to OUT_DIR/<attempt>-<worker id>.log, where
attempt is 100 times CHAOS_ATTEMPT (which bench/chaos.py raises at each launch of the whole job) plus hvdlite-run's
restart count: "start" once, "round" after each (re)initialisation, "resume" as each round starts training
(the steps its state holds), "batch" as each step starts (the step's number, the attempt and elastic round, the
epoch, the samples this rank trains on) and "done" with the final weights.

argv: --replay FRAMEWORK OUT_DIR. The reference: one process runs, step by step, the batches that the last
(attempt, round) to run each step logged, on the same model and data, averaging the ranks' gradients as the
allreduce does, and prints the steps and the final weights as JSON. A later round resumes from the last commit, so
the steps an earlier one ran from there on are superseded, whether or not the job ran them again before it
stopped: a job resumed from a checkpoint at an epoch's end, after the chaos, may stop without running a step."""

import json
import os
import sys
import time

BATCH = 8
SAMPLES = 480
STEP_SECONDS = 0.05  # a training step's compute, so that the chaos meets the job mid-step as often as not
LEARNING_RATE = 0.01

# The models are a linear regression, which converges and so forgets its history, plus a "ledger": one weight
# added to the loss times the batch's mean first feature. Its gradient never vanishes, so the ledger ends as the
# sum over every committed step of that step's samples, and a step lost, run twice or run on other samples shows
# in the final weights.


def logged_steps(out_dir):
    """step -> (attempt, round, {rank: sample indices}, size): the steps behind the final weights. Each (attempt,
    round) resumes from the last commit, so from the step after the one it resumed at (its "resume" entries), it
    supersedes what earlier ones ran, including steps it never reached because the job stopped first."""
    runs = {}  # (attempt, round) -> [size, first step, {step: {rank: indices}}]
    for name in sorted(os.listdir(out_dir)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(out_dir, name)) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:  # a worker killed while writing leaves half a line
                    continue
                if e["event"] not in ("resume", "batch"):
                    continue
                run = runs.setdefault((e["attempt"], e["round"]), [e["size"], None, {}])
                step = e["batches"] + 1 if e["event"] == "resume" else e["batches"]
                run[1] = step if run[1] is None else min(run[1], step)
                if e["event"] == "batch":
                    run[2].setdefault(step, {})[e["rank"]] = e["indices"]
    steps = {}
    for (attempt, round_), (size, resumed_at, ran) in sorted(runs.items()):
        steps = {step: kept for step, kept in steps.items() if step < resumed_at}
        steps.update((step, (attempt, round_, ranks, size)) for step, ranks in ran.items())
    return steps


def replay_steps(out_dir):
    """The committed steps in order, as (step, [each rank's sample indices]), checked to be complete."""
    steps = logged_steps(out_dir)
    assert sorted(steps) == list(range(1, len(steps) + 1)), "steps missing from the logs"
    for step in sorted(steps):
        attempt, round_, ranks, size = steps[step]
        assert sorted(ranks) == list(range(size)), f"step {step} ({attempt}, {round_}): ranks {sorted(ranks)}"
        yield step, [ranks[rank] for rank in range(size)]


class WorkerLog:
    """This worker's JSON-lines log (see the module's docstring)."""

    def __init__(self, out_dir):
        # Launches of the whole job (bench/chaos.py) and restarts by hvdlite-run --max-restarts within each.
        self.attempt = 100 * int(os.environ.get("CHAOS_ATTEMPT", "0")) + int(
            os.environ.get("HVDLITE_RESTART_COUNT", "0")
        )
        worker = os.environ.get("HVDLITE_WORKER_ID", "plain")
        self.path = os.path.join(out_dir, f"{self.attempt}-{worker}.log")

    def __call__(self, **event):
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(event, pid=os.getpid(), time=time.time(), attempt=self.attempt)) + "\n")


def log_resume(log, hvd, state):
    """As a round starts training: the steps its (synced) state holds. The round supersedes the steps earlier ones
    ran from there on, even when it runs none itself."""
    from hvdlite.common.elastic import current_round

    log(event="resume", batches=state.batches, round=current_round(), rank=hvd.rank(), size=hvd.size())


def stop_requested(out_dir, hvd, state):
    """At an epoch's end: rank 0 sees whether the chaos is over, and the job's last epoch becomes this one."""
    if hvd.rank() == 0 and os.path.exists(os.path.join(out_dir, "stop")):
        state.last_epoch = min(state.last_epoch, state.epoch)
    state.last_epoch = hvd.broadcast_object(state.last_epoch, root_rank=0, name="chaos.last_epoch")


# -- PyTorch ------------------------------------------------------------------------------------------------


def torch_data_and_model():
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 1)
            self.ledger = torch.nn.Parameter(torch.zeros(1))

        def loss(self, x, y):
            return torch.nn.functional.mse_loss(self.linear(x), y) + self.ledger[0] * x[:, 0].mean()

    torch.manual_seed(1234)  # the same data and initial model on every worker (state.sync() broadcasts anyway)
    features = torch.randn(SAMPLES, 8)
    targets = features @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
    return features, targets, Model()


def torch_weights(model):
    import torch

    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def torch_replay(out_dir):
    import torch

    features, targets, model = torch_data_and_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    count = 0
    for count, ranks in replay_steps(out_dir):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for indices in ranks:
            model.zero_grad()
            model.loss(features[indices], targets[indices]).backward()
            for total, p in zip(grads, model.parameters()):
                total += p.grad
        for total, p in zip(grads, model.parameters()):
            p.grad = total / len(ranks)
        optimizer.step()
    return count, torch_weights(model)


def torch_main(out_dir, max_epochs, log):
    import torch

    import hvdlite.torch as hvd
    from hvdlite.common.elastic import current_round

    torch.set_num_threads(1)
    hvd.init()
    features, targets, model = torch_data_and_model()
    dataset = torch.utils.data.TensorDataset(features, targets, torch.arange(len(features)))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LEARNING_RATE), named_parameters=model.named_parameters()
    )

    def on_reset():
        sampler.reset()
        log(event="round", rank=hvd.rank(), size=hvd.size(), round=current_round())

    @hvd.elastic.run
    def train(state):
        log_resume(log, hvd, state)
        while state.epoch < state.last_epoch:
            for batch_idx, (x, y, indices) in enumerate(loader):
                # Logged before the step's gradients leave this worker: a step whose allreduce failed somewhere is
                # run again by the next round, whose entries supersede these.
                log(
                    event="batch",
                    batches=state.batches + 1,
                    epoch=state.epoch,
                    round=current_round(),
                    rank=hvd.rank(),
                    size=hvd.size(),
                    indices=indices.tolist(),
                )
                optimizer.zero_grad()
                model.loss(x, y).backward()
                optimizer.step()
                sampler.record_batch(batch_idx, BATCH)
                state.batches += 1
                state.commit()
                time.sleep(STEP_SECONDS)
            state.epoch += 1
            stop_requested(out_dir, hvd, state)
            sampler.set_epoch(state.epoch)
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batches=0, last_epoch=max_epochs)
    state.register_reset_callbacks([on_reset])
    log(event="round", rank=hvd.rank(), size=hvd.size(), round=current_round())
    train(state)
    return hvd, state, torch_weights(model)


# -- Keras ----------------------------------------------------------------------------------------------------


def keras_data_and_model():
    import keras
    import numpy as np

    rng = np.random.default_rng(1234)
    features = rng.normal(size=(SAMPLES, 8)).astype("float32")
    targets = (features @ np.arange(1.0, 9.0, dtype="float32")[:, None] + 0.5).astype("float32")

    class Ledger(keras.layers.Layer):
        def build(self, input_shape):
            self.ledger = self.add_weight(shape=(1,), initializer="zeros")

        def call(self, x):
            self.add_loss(self.ledger[0] * keras.ops.mean(x[:, 0]))
            return x

    keras.utils.set_random_seed(1234)  # the same initial model on every worker (state.sync() broadcasts anyway)
    return features, targets, keras.Sequential([keras.Input((8,)), Ledger(), keras.layers.Dense(1)])


def keras_weights(model):
    import numpy as np

    return np.concatenate([w.ravel() for w in model.get_weights()]).tolist()


def epoch_steps(epoch, consumed, rank, size):
    """This rank's sample indices for each step left in the epoch: the epoch's permutation from sample `consumed`
    on, dealt out BATCH to a rank and step (a tail smaller than a step is dropped), as ElasticSampler does for
    the PyTorch job."""
    import numpy as np

    order = np.random.default_rng(7 + epoch).permutation(SAMPLES)[consumed:]
    per_step = BATCH * size
    return [order[s * per_step + rank * BATCH :][:BATCH] for s in range(len(order) // per_step)]


def keras_replay(out_dir):
    import keras
    import tensorflow as tf

    features, targets, model = keras_data_and_model()
    optimizer = keras.optimizers.SGD(LEARNING_RATE)

    @tf.function  # traced once for each count of ranks: eager steps made the replay take longer than a round
    def replay_step(inputs, outputs):
        grads = [tf.zeros_like(v) for v in model.trainable_variables]
        for x, y in zip(inputs, outputs):
            with tf.GradientTape() as tape:
                loss = keras.losses.MeanSquaredError()(y, model(x, training=True)) + sum(model.losses)
            grads = [total + g for total, g in zip(grads, tape.gradient(loss, model.trainable_variables))]
        optimizer.apply_gradients([(total / len(inputs), v) for total, v in zip(grads, model.trainable_variables)])

    count = 0
    for count, ranks in replay_steps(out_dir):
        replay_step([features[indices] for indices in ranks], [targets[indices] for indices in ranks])
    return count, keras_weights(model)


def keras_main(out_dir, max_epochs, log):
    import keras

    import hvdlite.tensorflow.keras as hvd
    from hvdlite.common.elastic import current_round

    hvd.init()
    features, targets, model = keras_data_and_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE)), loss="mse")

    class Batches(keras.utils.PyDataset):
        def __init__(self, steps):
            super().__init__()
            self.steps = steps

        def __len__(self):
            return len(self.steps)

        def __getitem__(self, i):
            return features[self.steps[i]], targets[self.steps[i]]

    class StepLog(keras.callbacks.Callback):
        """Logs each step as it starts and counts it when it ends (before CommitStateCallback commits it)."""

        def __init__(self, state, steps):
            super().__init__()
            self.state, self.steps = state, steps

        def on_train_batch_begin(self, batch, logs=None):
            log(
                event="batch",
                batches=self.state.batches + 1,
                epoch=self.state.epoch,
                round=current_round(),
                rank=hvd.rank(),
                size=hvd.size(),
                indices=self.steps[batch].tolist(),
            )

        def on_train_batch_end(self, batch, logs=None):
            self.state.batches += 1
            self.state.consumed += BATCH * hvd.size()
            time.sleep(STEP_SECONDS)

    @hvd.elastic.run
    def train(state):
        log_resume(log, hvd, state)
        # One fit() an epoch: a round re-formed mid-epoch goes on from the committed sample, at the new size.
        while state.epoch < state.last_epoch:
            steps = epoch_steps(state.epoch, state.consumed, hvd.rank(), hvd.size())
            if steps:
                model.fit(
                    Batches(steps),
                    epochs=1,
                    shuffle=False,  # the batches in the logged order
                    verbose=0,
                    callbacks=[StepLog(state, steps), hvd.elastic.CommitStateCallback(state, batches_per_commit=1)],
                )
            state.epoch += 1
            state.consumed = 0
            stop_requested(out_dir, hvd, state)
            state.commit()

    state = hvd.elastic.KerasState(model, epoch=0, consumed=0, batches=0, last_epoch=max_epochs)
    state.register_reset_callbacks(
        [lambda: log(event="round", rank=hvd.rank(), size=hvd.size(), round=current_round())]
    )
    log(event="round", rank=hvd.rank(), size=hvd.size(), round=current_round())
    train(state)
    return hvd, state, keras_weights(model)


FRAMEWORKS = {"torch": (torch_main, torch_replay), "keras": (keras_main, keras_replay)}


def main():
    framework, out_dir, max_epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    log = WorkerLog(out_dir)
    log(event="start", job=os.environ.get("HVDLITE_JOB_ID"))  # names this launch's shared memory
    hvd, state, weights = FRAMEWORKS[framework][0](out_dir, max_epochs, log)
    log(event="done", rank=hvd.rank(), size=hvd.size(), batches=state.batches, weights=weights)


if __name__ == "__main__":
    if sys.argv[1] == "--replay":
        steps, weights = FRAMEWORKS[sys.argv[2]][1](sys.argv[3])
        print(json.dumps({"steps": steps, "weights": weights}))
    else:
        main()
