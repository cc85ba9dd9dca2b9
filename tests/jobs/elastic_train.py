"""A worker of an elastic job (tests/test_elastic.py): a small model trained with hvd.elastic.

argv: OUT_DIR EPOCHS [OPTIMIZER]. OPTIMIZER: sgd (the default), or sharded-momentum (SGD with momentum whose
state DistributedOptimizer shards over the ranks, which every re-formed job must partition anew). Every worker
appends JSON lines to OUT_DIR/<worker id>.log: "start" once, "round" after each (re)initialisation with its rank,
size and torch thread count, "batch" as each step starts (the step's number, the elastic round, the epoch and the
sample indices this rank trains on), and "done" with the final weights and the sizes it trained at.
ELASTIC_SLOW_START (environment) delays one worker's start-up ("started" is logged after it).

argv: --replay OUT_DIR [OPTIMIZER]. The reference: one process replays the schedule the workers logged (for each
step, the batches every rank of the round that last ran it trained on) on the same model and data, averaging the
ranks' gradients as the allreduce does, and prints the final weights as JSON."""

import json
import os
import sys
import time

import torch

import hvdlite.torch as hvd
from hvdlite.common.elastic import current_round

LR = 0.01


def make_data_and_model():
    torch.manual_seed(1234)  # the same data and initial model on every worker (state.sync() broadcasts anyway)
    features = torch.randn(480, 8)
    targets = features @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
    return features, targets, torch.nn.Linear(8, 1)


def make_optimizer(params, kind):
    return torch.optim.SGD(params, lr=LR, momentum=0.9 if kind == "sharded-momentum" else 0.0)


def flat_weights(model):
    return torch.cat([model.weight.detach().flatten(), model.bias.detach()]).tolist()


def replay(out_dir, kind):
    """The reference run (see the module docstring): steps in order, each from the latest round that ran it (a
    round that failed after committing a step hands it to the next round, which goes on from that commit)."""
    steps = {}  # step -> (round, {rank: indices}, size)
    for name in os.listdir(out_dir):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(out_dir, name)) as f:
            for line in f:
                e = json.loads(line)
                if e["event"] != "batch":
                    continue
                round_, ranks, size = steps.get(e["batches"], (-1, {}, 0))
                if e["round"] > round_:
                    round_, ranks, size = e["round"], {}, e["size"]
                if e["round"] == round_:
                    ranks[e["rank"]] = e["indices"]
                steps[e["batches"]] = (round_, ranks, size)
    assert sorted(steps) == list(range(1, len(steps) + 1)), "steps missing from the logs"
    features, targets, model = make_data_and_model()
    optimizer = make_optimizer(model.parameters(), kind)
    for step in sorted(steps):
        round_, ranks, size = steps[step]
        assert sorted(ranks) == list(range(size)), f"step {step} (round {round_}): logged by ranks {sorted(ranks)}"
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for rank in range(size):
            model.zero_grad()
            x, y = features[ranks[rank]], targets[ranks[rank]]
            torch.nn.functional.mse_loss(model(x), y).backward()
            for total, p in zip(grads, model.parameters()):
                total += p.grad
        for total, p in zip(grads, model.parameters()):
            p.grad = total / size
        optimizer.step()
    print(json.dumps({"steps": len(steps), "weights": flat_weights(model)}))


if sys.argv[1] == "--replay":
    replay(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "sgd")
    sys.exit(0)

out_dir, epochs = sys.argv[1], int(sys.argv[2])
kind = sys.argv[3] if len(sys.argv) > 3 else "sgd"
worker = os.environ.get("HVDLITE_WORKER_ID", "plain")
log_path = os.path.join(out_dir, f"{worker}.log")


def log(**event):
    with open(log_path, "a") as f:
        f.write(json.dumps(dict(event, pid=os.getpid(), time=time.time())) + "\n")


log(event="start", threads=torch.get_num_threads())
# ELASTIC_SLOW_START="<worker id>=<seconds>": that worker takes so long to start, as a big framework's import can.
slow_worker, _, delay = os.environ.get("ELASTIC_SLOW_START", "=0").partition("=")
if worker == slow_worker:
    time.sleep(float(delay))
log(event="started")
hvd.init()
features, targets, model = make_data_and_model()
dataset = torch.utils.data.TensorDataset(features, targets, torch.arange(len(features)))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
optimizer = hvd.DistributedOptimizer(
    make_optimizer(model.parameters(), kind),
    named_parameters=model.named_parameters(),
    shard_optimizer_state=kind == "sharded-momentum",
)
sizes = []


def on_reset():
    sampler.reset()  # the new rank and size
    log(event="round", rank=hvd.rank(), size=hvd.size(), threads=torch.get_num_threads())


@hvd.elastic.run
def train(state):
    if not sizes or sizes[-1] != hvd.size():
        sizes.append(hvd.size())
    while state.epoch < epochs:
        for batch_idx, (x, y, indices) in enumerate(loader):
            # Logged before the step's gradients leave this worker: a worker stopped right after its contribution
            # reached the others has still logged it. A step whose allreduce failed somewhere is run again by the
            # next round, whose entries supersede these.
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
            sampler.record_batch(batch_idx, 8)
            state.batches += 1
            state.commit()
            time.sleep(0.03)
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batches=0)
state.register_reset_callbacks([on_reset])
log(event="round", rank=hvd.rank(), size=hvd.size(), threads=torch.get_num_threads())
train(state)
log(event="done", rank=hvd.rank(), size=hvd.size(), sizes=sizes, batches=state.batches, weights=flat_weights(model))
