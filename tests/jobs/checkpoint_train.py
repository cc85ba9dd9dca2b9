"""A job for tests/test_checkpoints.py: a small model trained under hvd.elastic.run with TorchState (model,
optimizer with momentum, ElasticSampler, plain attributes), whose checkpoints come from hvdlite-run's
--checkpoint-dir. Deterministic on the CPU, so an interrupted and resumed run ends with the same weights, bit for
bit, as one that was never interrupted.

argv: OUT_DIR [CRASH_STEP]. Rank 0 prints "START <step>" when train() begins (the step it resumed from) and
"STEP <n>" after each committed step, and at the end writes the final weights to OUT_DIR/weights.json. With
CRASH_STEP, rank 1 of the first attempt (HVDLITE_RESTART_COUNT 0) exits abruptly at that step.

PAUSE_AT="<step> before|after" (environment): rank 0 stops itself (SIGSTOP) at that step, before or after its
commit, for the test to kill the whole job there; steps take milliseconds, too short to aim a kill from outside.
LOSE_AT_FIRST_SYNC=<worker id> (environment, elastic jobs): that worker exits abruptly as it starts its first sync
as rank 0, after it loaded the checkpoint and before it handed it on."""

import json
import os
import signal
import sys

import torch

import hvdlite.torch as hvd

EPOCHS, SAMPLES, BATCH = 10, 48, 4  # 2 ranks: 6 steps an epoch, 60 in all

out_dir = sys.argv[1]
crash_step = int(sys.argv[2]) if len(sys.argv) > 2 else None
first_attempt = os.environ.get("HVDLITE_RESTART_COUNT", "0") == "0"
pause_step, pause_where = os.environ.get("PAUSE_AT", "0 none").split()

torch.set_num_threads(1)  # one summation order
hvd.init()
torch.manual_seed(0)
features = torch.randn(SAMPLES, 8)
targets = torch.sin(features.sum(dim=1, keepdim=True))
dataset = torch.utils.data.TensorDataset(features, targets)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), named_parameters=model.named_parameters()
)
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)


def say(text):
    if hvd.rank() == 0:
        print(text, flush=True)


def pause_here(step, where):
    if hvd.rank() == 0 and where == pause_where and step >= int(pause_step):
        os.kill(os.getpid(), signal.SIGSTOP)


@hvd.elastic.run
def train(state):
    say(f"START {state.step}")
    while state.epoch < EPOCHS:
        for batch_idx, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            sampler.record_batch(batch_idx, BATCH)
            state.step += 1
            if state.step == crash_step and hvd.rank() == 1 and first_attempt:
                os._exit(3)
            pause_here(state.step, "before")
            state.commit()
            pause_here(state.step, "after")
            say(f"STEP {state.step}")
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)
if os.environ.get("LOSE_AT_FIRST_SYNC", "-") == os.environ.get("HVDLITE_WORKER_ID"):
    sync = state.sync

    def sync_unless_rank_0():
        if hvd.rank() == 0:
            os._exit(9)
        sync()

    state.sync = sync_unless_rank_0
train(state)
if hvd.rank() == 0:
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    with open(os.path.join(out_dir, "weights.json"), "w") as f:
        json.dump({"step": state.step, "weights": weights}, f)
