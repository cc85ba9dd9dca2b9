"""Rank 1 exits with code 7 in the middle of collectives; each survivor prints the error it got and how long it
took (PEERERR), what a collective after that raises (AFTER), and that shutdown() returns (SHUTDOWN).

argv: [lane | slots]. By default the survivors wait in a new collective; with "lane" they loop a cached 8-byte
allreduce, which takes the steady lane (hvdlite_core/src/runtime/steady_lane.cc), and the time counts from their
last good call; with "slots", a step of asynchronous allreduces of 1 KB tensors whose names' slots take them
(hvdlite_core/src/runtime/fast_slots.h), timed from the step's start."""

import os
import signal
import sys
import time

import torch

import hvdlite.torch as hvd

hvd.init()
me = hvd.rank()
lane = sys.argv[1:] == ["lane"]
slots = sys.argv[1:] == ["slots"]
hvd.allreduce(torch.ones(4), name="warmup")
t = torch.ones(2)
for _ in range(200 if lane else 0):  # cached, and in the lane's steady state
    hvd.allreduce_(t, name="lane.steady", op=hvd.Max)
grads = [torch.ones(256) for _ in range(8)]


def slot_step(through_slots):
    handles = [hvd.allreduce_async_(g, name=f"slot.{i}") for i, g in enumerate(grads)]
    if through_slots and not all(h >> 62 == 1 for h in handles):  # a slot's handle (bit 62)
        raise AssertionError("the names' slots did not take the step")
    for h in handles:
        hvd.synchronize(h)


for step in range(4 if slots else 0):  # from the third step, through the names' slots
    slot_step(step >= 2)
if me == 1:
    if not lane:  # let the others block in the allreduce below; in the lane they are already waiting on its side
        time.sleep(1.0)
    os._exit(7)
# The starter SIGTERMs the other ranks as soon as rank 1 fails (and SIGKILLs them 5 s later): ignore SIGTERM so
# that this rank can show what hvdlite reports.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
start = time.monotonic()
try:
    while lane:
        hvd.allreduce_(t, name="lane.steady", op=hvd.Max)
        start = time.monotonic()
    if slots:
        slot_step(False)  # the slots', unless this rank already knows its peer is gone
    hvd.allreduce(torch.ones(1000), name="blocked")
    print("NOERROR", flush=True)
except hvd.HvdliteError as e:
    elapsed = time.monotonic() - start
    print(f"PEERERR {type(e).__name__} {elapsed:.2f} {str(e)!r}", flush=True)
    # after the failure the library must not hang: later calls fail fast, shutdown returns
    t = time.monotonic()
    try:
        hvd.allreduce(torch.ones(2), name="after")
        print("AFTER no error", flush=True)
    except hvd.HvdliteError as e2:
        print(f"AFTER {type(e2).__name__} {time.monotonic() - t:.2f}", flush=True)
    t = time.monotonic()
    hvd.shutdown()
    print(f"SHUTDOWN {time.monotonic() - t:.2f}", flush=True)
