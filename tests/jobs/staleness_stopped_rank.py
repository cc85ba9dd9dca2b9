"""Rank 1 stops itself with SIGSTOP at the start of step 8 and rank 0 lets it go on 2 s later (staleness 2).
Rank 0 never starts step k before rank 1 has finished computing step k - 1 - s (whose average rank 0 waited for
at the end of step k - 1), and it did start some step k before rank 1 finished computing step k - s: it ran s
steps ahead, the bound is reached and not just respected by a synchronous run. The stop comes at a known point,
after step 7's gradients went out and before step 8's are computed: stopped between computing a step and
submitting it, rank 1 would hold rank 0 one step short of the bound."""

import json
import os
import signal
import sys
import threading
import time

import torch
import torch.nn.functional as F
from staleness_common import R, batch, flat, hvd, make_model, same_everywhere

s = int(sys.argv[2])
model = make_model()
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(), staleness=s
)
pids = hvd.allgather_object(os.getpid())
out = open(sys.argv[1].format(rank=R), "w")


def note(event, step):
    out.write(json.dumps([event, step, time.monotonic()]) + "\n")
    out.flush()


def rank_1_state():
    with open(f"/proc/{pids[1]}/stat") as f:
        return f.read().rsplit(") ", 1)[1][0]


def release_rank_1():
    while rank_1_state() != "T":
        time.sleep(0.005)
    time.sleep(2.0)
    os.kill(pids[1], signal.SIGCONT)


for step in range(30):
    note("start", step)
    if step == 8 and R == 0:
        threading.Thread(target=release_rank_1, daemon=True).start()
    elif step == 8:
        os.kill(os.getpid(), signal.SIGSTOP)
    opt.zero_grad()
    x, y = batch(R, step)
    F.cross_entropy(model(x), y).backward()
    time.sleep(0.02)  # a step's compute
    note("computed", step)
    opt.step()  # submits this step's gradients, waits for the average of step - s and applies it
opt.drain()
out.close()
assert same_everywhere(flat(model), "final")
