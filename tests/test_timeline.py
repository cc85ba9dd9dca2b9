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
