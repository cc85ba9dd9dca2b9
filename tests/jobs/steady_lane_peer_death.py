"""The steady lane's exchange meets a dead peer: every rank loops a cached 8-byte allreduce (the lane's case) until
rank 1 exits with code 7 part way. Each survivor prints the error it got and how long after its last good call
(PEERERR), what a collective after that raises (AFTER), and that shutdown() returns (SHUTDOWN)."""

import os
import signal
import time

import torch

import hvdlite.torch as hvd

hvd.init()
me = hvd.rank()
t = torch.ones(2)
for _ in range(200):  # cached, and in the lane's steady state
    hvd.allreduce_(t, name="lane.steady", op=hvd.Max)
if me == 1:
    time.sleep(0.5)  # the others are in the lane, waiting on this rank's side of the exchange
    os._exit(7)
# The starter SIGTERMs the other ranks as soon as rank 1 fails (and SIGKILLs them 5 s later): ignore SIGTERM so
# that this rank can show what hvdlite reports.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
last_good = time.monotonic()
try:
    while True:
        hvd.allreduce_(t, name="lane.steady", op=hvd.Max)
        last_good = time.monotonic()
except hvd.HvdliteError as e:
    elapsed = time.monotonic() - last_good
    print(f"PEERERR {type(e).__name__} {elapsed:.2f} {str(e)!r}", flush=True)
    t0 = time.monotonic()
    try:
        hvd.allreduce_(t, name="lane.steady", op=hvd.Max)
        print("AFTER no error", flush=True)
    except hvd.HvdliteError as e2:
        print(f"AFTER {type(e2).__name__} {time.monotonic() - t0:.2f}", flush=True)
    t0 = time.monotonic()
    hvd.shutdown()
    print(f"SHUTDOWN {time.monotonic() - t0:.2f}", flush=True)
