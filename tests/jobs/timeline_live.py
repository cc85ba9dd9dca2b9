"""Rank 0 reads the timeline file 0.1 s after a collective ended and finds it there; after more collectives it
kills itself with SIGKILL, for the test to read the file it leaves. argv[1]: the timeline's path."""

import os
import signal
import sys
import time

import torch

import hvdlite.torch as hvd

path = sys.argv[1]
hvd.init()
hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce")
time.sleep(0.1)  # as soon as Horovod's own timeline test reads the file
if hvd.rank() == 0:
    text = open(path).read()
    assert "test_allreduce" in text and "NEGOTIATE_allreduce" in text and "ALLREDUCE" in text, text
for i in range(5):
    hvd.allreduce(torch.ones(4), name=f"before_kill.{i}")
time.sleep(0.1)
hvd.barrier()
print("LIVE OK", flush=True)
if hvd.rank() == 0:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
