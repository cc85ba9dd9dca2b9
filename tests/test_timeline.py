"""HVDLITE_TIMELINE writes a valid Chrome trace on rank 0: negotiation and execution spans for each tensor."""

import json
import os
import subprocess
import sys

import pytest
from multiproc import job_source, run_job, run_job_function

import hvdlite.timeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(120)
def test_timeline_records_negotiation_and_fused_execution(tmp_path):
    path = tmp_path / "timeline.json"
    run_job_function("timeline_fused", np=2, env={"HVDLITE_TIMELINE": str(path)}, timeout=60)
    events = hvdlite.timeline.load(str(path))
    assert hvdlite.timeline.check(events) == []
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
    assert by_tensor["gathered"] == ["NEGOTIATE_allgather", "ALLGATHER (ring)"]  # 32 bytes: the ring
    assert all(e["ts"] >= 0 for e in spans)
    # Unnamed allreduces of one kind: the first is negotiated, the rest served by the response cache (a cached
    # 8-byte allreduce travels inside the negotiation exchange), each on the row of the name the core gave it.
    phases = {}
    for e in spans:
        phases.setdefault(rows[e["pid"]], []).append(e["ph"])
    unnamed = sorted((r for r in by_tensor if r.startswith("allreduce.noname.")), key=lambda r: int(r.split(".")[-1]))
    assert len(unnamed) == 10, sorted(by_tensor)
    for row in unnamed:
        assert by_tensor[row][0] == "NEGOTIATE_allreduce" and len(by_tensor[row]) == 2, (row, by_tensor[row])
        assert phases[row] == ["B", "E", "B", "E"], (row, phases[row])
    assert [by_tensor[row][1] for row in unnamed[1:]] == ["ALLREDUCE (eager)"] * 9, {r: by_tensor[r] for r in unnamed}


@pytest.mark.timeout(120)
def test_timeline_is_readable_while_the_job_runs_and_after_a_kill(tmp_path):
    """The file holds a collective's events within 0.1 s of its end, while the job runs; a job killed with SIGKILL
    leaves a file cut between two whole events, a trace once the optional closing bracket is supplied (as the
    Trace Event Format allows and trace viewers do)."""
    path = tmp_path / "live.json"
    # Not through the harness: rank 0 kills itself, so the job fails by design.
    result = run_job(
        job_source("timeline_live"), np=2, args=[str(path)], env={"HVDLITE_TIMELINE": str(path)}, timeout=60
    )
    assert result.stdout.count("LIVE OK") == 2, result.stdout + result.stderr
    assert result.returncode != 0  # rank 0 killed itself
    text = path.read_text()
    assert text.startswith("[\n") and text.endswith("}"), text[-200:]
    events = json.loads(text + "\n]")
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    ran = {rows[e["pid"]] for e in events if e["ph"] == "B" and e["name"].startswith("ALLREDUCE")}
    assert {"test_allreduce", "before_kill.0", "before_kill.4"} <= ran, ran


@pytest.mark.timeout(120)
def test_timeline_started_and_stopped_at_run_time(tmp_path):
    """hvd.start_timeline / hvd.stop_timeline (Horovod's API): each file is a complete Chrome trace holding
    exactly what ran while it was open; start replaces a running one; shutdown closes it; only rank 0 writes."""
    run_job_function("timeline_runtime", np=2, args=[str(tmp_path)], timeout=60)


def test_timeline_with_rank_in_the_path_is_written_by_every_rank(tmp_path):
    """A path with {rank} gives every rank its own timeline (to see both sides of a step)."""
    run_job_function("timeline_per_rank", np=2, args=[str(tmp_path)], timeout=60)


def span(phase, ts, pid=1, name="ALLREDUCE"):
    event = {"ph": phase, "ts": ts, "pid": pid, "tid": 1}
    if phase != "E":
        event["name"] = name
    return event


@pytest.mark.parametrize(
    "events, problem",
    [
        ([span("E", 5)], "no span open"),
        ([span("B", 5), span("E", 4)], "ends at 4 before it began at 5"),
        ([span("B", 5)], "never ends"),
        ([span("B", 1), span("E", 2, pid=2)], "no span open"),  # spans pair within their own row only
        ([{"ph": "B", "ts": -1, "pid": 1, "tid": 1, "name": "x"}], "'ts' must be a non-negative number"),
        ([{"ph": "B", "ts": "7", "pid": 1, "tid": 1, "name": "x"}], "'ts' must be a non-negative number"),
        ([{"ph": "i", "ts": 1, "pid": "1", "tid": 1, "name": "x"}], "must be integers"),
        ([{"ph": "i", "ts": 1, "pid": 1, "tid": 1}], "needs a 'name'"),
        ([{"ph": "Q", "ts": 1, "pid": 1, "tid": 1}], "unknown phase 'Q'"),
        ([{"ph": "M", "name": "process_name"}], "metadata without 'args'"),
        ([["B", 1]], "not a JSON object"),
    ],
)
def test_trace_checker_names_what_breaks_the_format(events, problem):
    problems = hvdlite.timeline.check(events)
    assert any(problem in p for p in problems), problems
    assert hvdlite.timeline.check([span("B", 1), span("B", 2, name="inner"), span("E", 3), span("E", 3)]) == []


def test_trace_reader_takes_cut_files_and_trace_objects(tmp_path):
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad"}},
        span("B", 10, name="NEGOTIATE_allreduce"),
        span("E", 30),
        span("B", 30, name="ALLREDUCE (fused x2)"),
        span("E", 35),
        span("B", 40, name="ALLREDUCE"),
        span("E", 47),
    ]
    whole = "[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n"
    path = tmp_path / "t.json"
    path.write_text(whole)
    assert hvdlite.timeline.load(str(path)) == events
    path.write_text(whole[: whole.index(json.dumps(events[3]))] + json.dumps(events[3])[:9])  # killed mid-line
    assert hvdlite.timeline.load(str(path)) == events[:3]
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    summaries, cycles = hvdlite.timeline.summarize(hvdlite.timeline.load(str(path)))
    assert cycles == 0 and len(summaries) == 1
    assert summaries[0].count == {"NEGOTIATE_allreduce": 1, "ALLREDUCE": 2}
    assert summaries[0].total_us == {"NEGOTIATE_allreduce": 20, "ALLREDUCE": 12}
    path.write_text(json.dumps({"events": []}))
    cli = subprocess.run([sys.executable, "-m", "hvdlite.timeline", str(path)], capture_output=True, text=True)
    assert cli.returncode == 2 and "without 'traceEvents'" in cli.stderr, cli


@pytest.mark.timeout(300)
def test_timeline_example_records_steps_and_the_trace_passes_the_checker(tmp_path):
    """examples/pytorch_timeline.py as a user runs it, then `python -m hvdlite.timeline` on its trace."""
    trace = tmp_path / "steps.json"
    script = f"""
import runpy, sys
sys.argv = ["pytorch_timeline.py", "--trace", {str(trace)!r}, "--record-from", "2", "--record-steps", "2"]
runpy.run_path({os.path.join(ROOT, "examples", "pytorch_timeline.py")!r}, run_name="__main__")
"""
    result = run_job(script, np=2, timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "recorded steps 2..3" in out and "open " in out, out
    events = hvdlite.timeline.load(str(trace))
    assert hvdlite.timeline.check(events) == []
    summaries, cycles = hvdlite.timeline.summarize(events)
    gradients = {s.tensor for s in summaries}
    assert "allreduce.fc.weight" in gradients and "allreduce.conv1.weight" in gradients, gradients
    assert all(s.count.get("NEGOTIATE_allreduce") == 2 for s in summaries), summaries  # two steps, once each
    assert all(sum(n for a, n in s.count.items() if a != "NEGOTIATE_allreduce") == 2 for s in summaries)
    assert cycles >= 2
    checked = subprocess.run(
        [sys.executable, "-m", "hvdlite.timeline", str(trace), "--check"], capture_output=True, text=True
    )
    assert checked.returncode == 0 and "well-formed" in checked.stdout, checked
    table = subprocess.run(
        [sys.executable, "-m", "hvdlite.timeline", str(trace), "--top", "3"], capture_output=True, text=True
    )
    assert table.returncode == 0 and f"{len(summaries)} tensors" in table.stdout, table
    assert len({line.split()[0] for line in table.stdout.splitlines()[2:]}) == 3, table.stdout
