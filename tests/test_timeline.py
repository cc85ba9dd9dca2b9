"""HVDLITE_TIMELINE writes a valid Chrome trace on rank 0: negotiation and execution spans for each tensor."""
import json

import pytest

from multiproc import run_job


@pytest.mark.timeout(120)
def test_timeline_records_negotiation_and_fused_execution(tmp_path):
    path = tmp_path / "timeline.json"
    result = run_job("""
import torch, hvdlite.torch as hvd
hvd.init()
handles = [hvd.allreduce_async(torch.ones(10) * i, name=f"grad.{i}") for i in range(4)]
for h in handles:
    hvd.synchronize(h)
hvd.allgather(torch.ones(2, 2), name="gathered")
hvd.shutdown()
""", np=2, env={"HVDLITE_TIMELINE": str(path)}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    events = json.loads(path.read_text())
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {"grad.0", "grad.3", "gathered"} <= set(rows.values())
    spans = [e for e in events if e["ph"] in "BE"]
    assert sum(e["ph"] == "B" for e in spans) == sum(e["ph"] == "E" for e in spans)
    by_tensor = {}
    for e in spans:
        if e["ph"] == "B":
            by_tensor.setdefault(rows[e["pid"]], []).append(e["name"])
    assert by_tensor["grad.1"][0] == "NEGOTIATE_allreduce"
    assert by_tensor["grad.1"][1].startswith("ALLREDUCE")
    assert by_tensor["gathered"] == ["NEGOTIATE_allgather", "ALLGATHER"]
    assert all(e["ts"] >= 0 for e in spans)


RUNTIME_TIMELINE = """
import json, os, sys, time
import torch
import hvdlite.torch as hvd

out_dir = sys.argv[1]
hvd.init()
me, n = hvd.rank(), hvd.size()


def path(name):
    return os.path.join(out_dir, f"{name}.rank{me}.json")


def load(name):
    with open(path(name)) as f:
        events = json.load(f)  # a complete JSON array: the file was closed properly
    assert all(e["ph"] in ("B", "E", "M", "i") for e in events), events
    assert all(e["ts"] >= 0 for e in events if "ts" in e), events
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    depth = {}
    for e in events:  # every span ends, and never before it began
        if e["ph"] in "BE":
            depth[e["pid"]] = depth.get(e["pid"], 0) + (1 if e["ph"] == "B" else -1)
            assert depth[e["pid"]] >= 0, (name, rows.get(e["pid"]), events)
    assert all(d == 0 for d in depth.values()), (name, depth, rows)
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
    assert spans["first.gathered"] == ["NEGOTIATE_allgather", "ALLGATHER"], spans
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
print("TIMELINE OK", flush=True)
"""


@pytest.mark.timeout(120)
def test_timeline_started_and_stopped_at_run_time(tmp_path):
    """hvd.start_timeline / hvd.stop_timeline (Horovod's API): each file is a complete Chrome trace holding
    exactly what ran while it was open; start replaces a running one; shutdown closes it; only rank 0 writes."""
    result = run_job(RUNTIME_TIMELINE, np=2, args=[str(tmp_path)], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("TIMELINE OK") == 2, result.stdout + result.stderr
