"""One worker of the chaos run (bench/chaos.py): a small model trained with hvd.elastic, its state committed at
every step and written to hvdlite-run's --checkpoint-dir, so that a worker lost mid-round rolls back to the last
commit and a job killed whole resumes from the last checkpoint.

argv: OUT_DIR MAX_EPOCHS. The job trains until OUT_DIR/stop exists, then to the end of that epoch (at most
MAX_EPOCHS). Every worker appends JSON lines to OUT_DIR/<attempt>-<worker id>.log, where attempt is 100 times
CHAOS_ATTEMPT (which bench/chaos.py raises at each launch of the whole job) plus hvdlite-run's restart count:
"start" once, "round" after each (re)initialisation, "batch" as each step starts (the step's number, the attempt
and elastic round, the epoch, the samples this rank trains on) and "done" with the final weights.

argv: --replay OUT_DIR. The reference: one process runs, step by step, the batches that the last (attempt, round)
to run each step logged, on the same model and data, averaging the ranks' gradients as the allreduce does, and
prints the steps and the final weights as JSON. A step that a failed round had run is superseded by the round that
ran it again from the last commit."""

import json
import os
import sys
import time

import torch

BATCH = 8
SAMPLES = 480
STEP_SECONDS = 0.05  # a training step's compute, so that the chaos meets the job mid-step as often as not


def make_data_and_model():
    torch.manual_seed(1234)  # the same data and initial model on every worker (state.sync() broadcasts anyway)
    features = torch.randn(SAMPLES, 8)
    targets = features @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
    return features, targets, torch.nn.Linear(8, 1)


def flat_weights(model):
    return torch.cat([model.weight.detach().flatten(), model.bias.detach()]).tolist()


def logged_steps(out_dir):
    """step -> (attempt, round, {rank: sample indices}, size), from the last (attempt, round) that ran each step."""
    steps = {}
    for name in sorted(os.listdir(out_dir)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(out_dir, name)) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:  # a worker killed while writing leaves half a line
                    continue
                if e["event"] != "batch":
                    continue
                key = (e["attempt"], e["round"])
                attempt, round_, ranks, size = steps.get(e["batches"], (-1, -1, {}, 0))
                if key > (attempt, round_):
                    attempt, round_, ranks, size = key[0], key[1], {}, e["size"]
                if key == (attempt, round_):
                    ranks[e["rank"]] = e["indices"]
                steps[e["batches"]] = (attempt, round_, ranks, size)
    return steps


def replay(out_dir):
    steps = logged_steps(out_dir)
    assert sorted(steps) == list(range(1, len(steps) + 1)), "steps missing from the logs"
    features, targets, model = make_data_and_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in sorted(steps):
        attempt, round_, ranks, size = steps[step]
        assert sorted(ranks) == list(range(size)), f"step {step} ({attempt}, {round_}): ranks {sorted(ranks)}"
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for rank in range(size):
            model.zero_grad()
            torch.nn.functional.mse_loss(model(features[ranks[rank]]), targets[ranks[rank]]).backward()
            for total, p in zip(grads, model.parameters()):
                total += p.grad
        for total, p in zip(grads, model.parameters()):
            p.grad = total / size
        optimizer.step()
    print(json.dumps({"steps": len(steps), "weights": flat_weights(model)}))


def main():
    import hvdlite.torch as hvd
    from hvdlite.common.elastic import current_round

    out_dir, max_epochs = sys.argv[1], int(sys.argv[2])
    # Launches of the whole job (bench/chaos.py) and restarts by hvdlite-run --max-restarts within each.
    attempt = 100 * int(os.environ.get("CHAOS_ATTEMPT", "0")) + int(os.environ.get("HVDLITE_RESTART_COUNT", "0"))
    worker = os.environ.get("HVDLITE_WORKER_ID", "plain")
    log_path = os.path.join(out_dir, f"{attempt}-{worker}.log")

    def log(**event):
        with open(log_path, "a") as f:
            f.write(json.dumps(dict(event, pid=os.getpid(), time=time.time(), attempt=attempt)) + "\n")

    torch.set_num_threads(1)
    log(event="start")
    hvd.init()
    features, targets, model = make_data_and_model()
    dataset = torch.utils.data.TensorDataset(features, targets, torch.arange(len(features)))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )

    def on_reset():
        sampler.reset()
        log(event="round", rank=hvd.rank(), size=hvd.size(), round=current_round())

    @hvd.elastic.run
    def train(state):
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
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                sampler.record_batch(batch_idx, BATCH)
                state.batches += 1
                state.commit()
                time.sleep(STEP_SECONDS)
            state.epoch += 1
            # The chaos is over: this epoch was the last (rank 0 decides, the commit carries it to every rank).
            if hvd.rank() == 0 and os.path.exists(os.path.join(out_dir, "stop")):
                state.last_epoch = min(state.last_epoch, state.epoch)
            state.last_epoch = hvd.broadcast_object(state.last_epoch, root_rank=0, name="chaos.last_epoch")
            sampler.set_epoch(state.epoch)
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batches=0, last_epoch=max_epochs)
    state.register_reset_callbacks([on_reset])
    log(event="round", rank=hvd.rank(), size=hvd.size(), round=current_round())
    train(state)
    log(event="done", rank=hvd.rank(), size=hvd.size(), batches=state.batches, weights=flat_weights(model))


if __name__ == "__main__":
    if sys.argv[1] == "--replay":
        replay(sys.argv[2])
    else:
        main()
