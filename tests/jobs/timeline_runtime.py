"""hvd.start_timeline and hvd.stop_timeline at run time: each file holds exactly what ran while it was open, a
second start replaces a running timeline, shutdown closes it, only rank 0 writes. argv[1]: a folder."""

import os
import sys
import time

import torch

import hvdlite.timeline
import hvdlite.torch as hvd

out_dir = sys.argv[1]
hvd.init()
me, n = hvd.rank(), hvd.size()


def path(name):
    return os.path.join(out_dir, f"{name}.rank{me}.json")


def load(name):
    events = hvdlite.timeline.load(path(name))  # a complete JSON array: the file was closed properly
    problems = hvdlite.timeline.check(events)  # spans nest and end, timestamps valid: Perfetto will load it
    assert not problems, (name, problems)
    with open(path(name)) as f:
        assert f.read().rstrip().endswith("]"), name
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    spans = {}
    for e in events:
        if e["ph"] == "B":
            spans.setdefault(rows[e["pid"]], []).append(e["name"])
    return spans, sum(e["ph"] == "i" and e["name"] == "CYCLE_START" for e in events)


def ones(name):
    return hvd.allreduce(torch.ones(3), op=hvd.Sum, name=name)


hvd.stop_timeline()  # nothing running: a no-op
ones("before")
hvd.start_timeline(path("first"))
handles = [hvd.allreduce_async(torch.ones(10) * i, name=f"first.{i}") for i in range(4)]
for h in handles:
    hvd.synchronize(h)
hvd.allgather(torch.ones(2, 2), name="first.gathered")
# a tensor still negotiating when the timeline stops: rank 0 submits it first, the others after the stop
if me == 0:
    straddling = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="straddle")
    time.sleep(0.2)
hvd.stop_timeline()
hvd.barrier()
if me != 0:
    straddling = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="straddle")
assert hvd.synchronize(straddling).tolist() == [float(n)] * 3
ones("between")
hvd.start_timeline(path("second"), mark_cycles=True)
ones("second")
hvd.start_timeline(path("third"))  # replaces the running timeline: "second" is closed
ones("third")
hvd.shutdown()  # closes the running timeline

if me == 0:
    spans, cycles = load("first")
    assert {"first.0", "first.3", "first.gathered"} <= set(spans), spans
    assert "before" not in spans and "between" not in spans, spans
    assert spans["first.1"][0] == "NEGOTIATE_allreduce" and spans["first.1"][1].startswith("ALLREDUCE"), spans
    assert spans["first.gathered"] == ["NEGOTIATE_allgather", "ALLGATHER (ring)"], spans
    assert spans["straddle"] == ["NEGOTIATE_allreduce"], spans  # ended by the stop, never executed there
    assert cycles == 0, "mark_cycles was off"
    spans, cycles = load("second")
    assert set(spans) == {"second"} and cycles >= 1, (spans, cycles)
    spans, cycles = load("third")
    assert set(spans) == {"third"} and cycles == 0, (spans, cycles)
    try:
        hvd.init()
        hvd.start_timeline(os.path.join(out_dir, "missing-dir", "x.json"))
    except hvd.InvalidArgumentError as e:
        assert "missing-dir" in str(e), e
    else:
        raise AssertionError("an unwritable timeline path was accepted")
else:
    hvd.init()
    for name in ("first", "second", "third"):
        assert not os.path.exists(path(name)), "only rank 0 writes the timeline"
hvd.barrier()
hvd.shutdown()
try:
    hvd.start_timeline(path("late"))
except ValueError as e:  # Horovod raises ValueError when not initialised; NotInitializedError is one
    assert isinstance(e, hvd.NotInitializedError), e
else:
    raise AssertionError("start_timeline before init was accepted")
