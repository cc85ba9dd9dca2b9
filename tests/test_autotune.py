"""HVDLITE_AUTOTUNE=1 across real processes: the search changes the fusion threshold and the cycle time between
windows while results stay correct, every rank ends on rank 0's choice, rank 0 says what it chose and writes every
window's score to AUTOTUNE_LOG. (Whether its choice is as good as the hand-set values is bench/train.py's
--autotune row: docs/benchmarks.md.)"""

from __future__ import annotations

import csv

import pytest
from multiproc import run_job_function


@pytest.mark.timeout(150)
def test_autotune_searches_and_agrees(tmp_path):
    log = tmp_path / "autotune.csv"
    env = {
        "HVDLITE_AUTOTUNE": "1",
        "HVDLITE_AUTOTUNE_WINDOW_BYTES": str(150 << 10),
        "HVDLITE_AUTOTUNE_WARMUP_WINDOWS": "1",
        "HOROVOD_AUTOTUNE_LOG": str(log),
    }
    out = run_job_function("autotune_search", np=2, env=env, timeout=120)
    assert "[0]<stderr>: hvdlite autotune: chose FUSION_THRESHOLD=" in out, out[-6000:]
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
    run_job_function("autotune_one_rank", np=2, timeout=40)
