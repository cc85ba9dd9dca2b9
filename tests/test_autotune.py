"""HVDLITE_AUTOTUNE=1 across real processes: the search changes the fusion threshold and the cycle time between
windows while results stay correct, every rank ends on rank 0's choice, rank 0 says what it chose and writes every
window's score to AUTOTUNE_LOG. (Whether its choice is as good as the hand-set values is bench/train.py's
--autotune row: docs/benchmarks.md.)"""

from __future__ import annotations

import csv

import pytest
from hvdjob import assert_job_ok, prelude
from multiproc import run_job

JOB = """
import torch
import hvdlite.torch as hvd
from hvdjob import check, make, parse_build_info, reduce_reference
hvd.init()
n, me = hvd.size(), hvd.rank()
count = 0
states = set()
for step in range(60):
    # Like a backward pass: many gradients in flight at once, fused or not depending on the threshold in use.
    shapes = [(1000 + 7 * i,) for i in range(40)]
    inputs = [make(me, ("grad", step % 5, i), s, torch.float32) for i, s in enumerate(shapes)]
    handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"grad.{i}") for i, t in enumerate(inputs)]
    for i, h in enumerate(handles):
        expected = reduce_reference([make(r, ("grad", step % 5, i), shapes[i], torch.float32) for r in range(n)],
                                    "Sum", torch.float32)
        check(f"step {step} tensor {i}", hvd.synchronize(h), expected, exact=False)
        count += 1
    info = parse_build_info(hvd.build_info())
    states.add(info["autotune"])
info = parse_build_info(hvd.build_info())
assert info["autotune"] == "done", info["autotune"]
assert "searching" in states, states
mine = torch.tensor([float(info["tuned_fusion_threshold"]), float(info["tuned_cycle_time_ms"])], dtype=torch.float64)
everyone = hvd.allgather(mine.reshape(1, 2), name="tuned")
assert all(torch.equal(everyone[0], everyone[r]) for r in range(n)), everyone
print(f"OK {count} tensors checked; tuned {info['tuned_fusion_threshold']} {info['tuned_cycle_time_ms']}", flush=True)
"""


@pytest.mark.timeout(150)
def test_autotune_searches_and_agrees(tmp_path):
    log = tmp_path / "autotune.csv"
    env = {
        "HVDLITE_AUTOTUNE": "1",
        "HVDLITE_AUTOTUNE_WINDOW_BYTES": str(150 << 10),
        "HVDLITE_AUTOTUNE_WARMUP_WINDOWS": "1",
        "HOROVOD_AUTOTUNE_LOG": str(log),
    }
    result = run_job(prelude() + JOB, np=2, env=env, timeout=120)
    assert_job_ok(result, 2, min_count=2400)
    assert "[0]<stderr>: hvdlite autotune: chose FUSION_THRESHOLD=" in result.stdout + result.stderr, (
        result.stdout[-3000:] + result.stderr[-3000:]
    )
    with open(log, encoding="utf-8") as f:
        rows = [row for row in csv.reader(f) if row and not row[0].startswith("#")]
    header, windows = rows[0], rows[1:]
    assert header[:3] == ["window", "fusion_threshold_bytes", "cycle_time_ms"], header
    # One warm-up window, then every candidate of the 5 x 2 grid at least once, then the halving rounds.
    assert windows[0][-1] == "warmup" and all(w[-1] == "search" for w in windows[1:]), windows
    assert len({(w[1], w[2]) for w in windows[1:]}) == 10, windows
    assert len(windows) == 1 + 10 + 5 + 3 + 2, len(windows)
    assert all(float(w[5]) > 0 for w in windows), windows


@pytest.mark.timeout(60)
def test_autotune_is_a_setting_every_rank_must_share():
    """The windows end where every rank broadcasts: a rank without the tuner would never join; init refuses."""
    script = (
        prelude()
        + """
import os
if os.environ["HVDLITE_RANK"] == "1":
    os.environ["HVDLITE_AUTOTUNE"] = "1"
import hvdlite.torch as hvd
from hvdjob import expect_raises
expect_raises("autotune on rank 1 only", hvd.HvdliteError, hvd.init,
              match=["HVDLITE_AUTOTUNE differs between ranks", "0 on rank 0", "1 on rank 1"])
print("OK 1", flush=True)
"""
    )
    result = run_job(script, np=2, timeout=40)
    assert_job_ok(result, 2)
