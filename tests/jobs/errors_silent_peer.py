"""Rank 1 stops itself (SIGSTOP: its connections stay open); rank 0 prints the error its allreduce gets and when
(SILENT), then kills rank 1."""

import os
import signal
import time

import torch

import hvdlite.torch as hvd

hvd.init()
me = hvd.rank()
pids = hvd.allgather(torch.tensor([os.getpid()]), name="pids").tolist()
if me == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # alive (connections open) but silent
signal.signal(signal.SIGTERM, signal.SIG_IGN)
start = time.monotonic()
try:
    hvd.allreduce(torch.ones(10), name="blocked")
    print("NOERROR", flush=True)
except hvd.HvdliteError as e:
    print(f"SILENT {type(e).__name__} {time.monotonic() - start:.2f} {str(e)!r}", flush=True)
finally:
    os.kill(pids[1], signal.SIGKILL)
