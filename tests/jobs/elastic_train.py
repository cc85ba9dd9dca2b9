"""A worker of an elastic job (tests/test_elastic.py): a small model trained with hvd.elastic.

argv: OUT_DIR EPOCHS. Every worker appends JSON lines to OUT_DIR/<worker id>.log: "start" once, "round" after
each (re)initialisation with its rank and size, "batch" after every committed batch (its epoch and the sample
indices this rank trained on), and "done" with the final weights and the sizes it trained at."""
import json
import os
import sys
import time

import torch

import hvdlite.torch as hvd

out_dir, epochs = sys.argv[1], int(sys.argv[2])
worker = os.environ.get("HVDLITE_WORKER_ID", "plain")
log_path = os.path.join(out_dir, f"{worker}.log")


def log(**event):
    with open(log_path, "a") as f:
        f.write(json.dumps(dict(event, pid=os.getpid(), time=time.time())) + "\n")


log(event="start")
hvd.init()
torch.manual_seed(1234)  # the same data on every worker; the model is broadcast by state.sync()
features = torch.randn(480, 8)
targets = features @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
dataset = torch.utils.data.TensorDataset(features, targets, torch.arange(len(features)))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
model = torch.nn.Linear(8, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
sizes = []


def on_reset():
    sampler.reset()  # the new rank and size
    log(event="round", rank=hvd.rank(), size=hvd.size())


@hvd.elastic.run
def train(state):
    if not sizes or sizes[-1] != hvd.size():
        sizes.append(hvd.size())
    while state.epoch < epochs:
        for batch_idx, (x, y, indices) in enumerate(loader):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            sampler.record_batch(batch_idx, 8)
            state.batches += 1
            # Logged before commit(), which saves first and may then raise HostsUpdatedInterrupt: the batch is
            # committed either way (a failed step raises before this line).
            log(event="batch", batches=state.batches, epoch=state.epoch, rank=hvd.rank(), size=hvd.size(),
                indices=indices.tolist())
            state.commit()
            time.sleep(0.03)
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batches=0)
state.register_reset_callbacks([on_reset])
log(event="round", rank=hvd.rank(), size=hvd.size())
train(state)
weights = torch.cat([model.weight.detach().flatten(), model.bias.detach()]).tolist()
log(event="done", rank=hvd.rank(), size=hvd.size(), sizes=sizes, batches=state.batches, weights=weights)
