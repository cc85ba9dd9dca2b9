"""Soak: tens of thousands of collectives of random kinds, sizes, dtypes and process sets on 4 ranks
(tests/jobs/soak.py): every result right, the memory held flat after warm-up, no file descriptor and no shared-memory
segment left over.

The job samples three measures of the memory held, every 500 operations after warm-up, with the caches that churn
emptied first (see the job): the resident size, malloc's bytes in use, and Python's allocated blocks. "Flat" compares
the low quartile of the last third of the samples with that of the first third, so that a sample taken beside a
passing spike does not decide. Limits, against ten runs without a leak and two with each leak put into the job by
hand (2026-11-27, Intel Xeon, 4 ranks each):

- Python's blocks (about 127,700): at most 300 more. Without a leak +108 to +146 (the job's own sample lists); one
  object kept per 20 operations: +484 to +648; a 250-byte bytearray kept per operation: +14,000 to +21,000.
- malloc's bytes in use (the core's C++ heap, numpy, cffi; about 8.2 MB): at most 2% more. Without a leak -0.1% to
  +0.5%; 16 bytes malloc'd and never freed per operation: +2.8% to +5.1%.
- resident size, the backstop for memory no allocator counts: at most 3% more. Without a leak -6.2% to +1.3%; the
  250-byte bytearray: +1.7% to +4.0%. Before the job emptied the request cache, runs without a leak reached +6.4%.

CI runs 30,000 operations (warm-up: the first 10,000), as do the runs docs/faults.md records; ``HVDLITE_SOAK_OPS``
sets another count."""

from __future__ import annotations

import json
import os
import statistics

import pytest
from hvdjob import prelude
from multiproc import run_job

# Alone (tests/conftest.py): it compares every /dev/shm entry before and after.
pytestmark = pytest.mark.alone

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "soak.py")
OPS = int(os.environ.get("HVDLITE_SOAK_OPS", "30000"))


def low_quartiles(samples: list) -> tuple:
    """(low quartile of the first third, low quartile of the last third) of one measure's samples."""
    assert len(samples) >= 6, f"too few memory samples after warm-up: {samples}"
    third = len(samples) // 3
    low = lambda part: statistics.quantiles(part, n=4)[0]  # noqa: E731
    return low(samples[:third]), low(samples[-third:])


def shm_entries() -> set:
    return set(os.listdir("/dev/shm"))


@pytest.mark.timeout(60 + OPS // 500)
def test_soak_keeps_results_right_and_resources_flat():
    before = shm_entries()
    with open(JOB) as f:
        script = prelude() + f.read()
    result = run_job(script, np=4, args=[OPS, min(10000, OPS // 3)], timeout=30 + OPS // 500)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    reports = [json.loads(line.split("SOAK ", 1)[1]) for line in result.stdout.splitlines() if "SOAK " in line]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3], out[-3000:]
    for r in reports:
        assert r["ops"] >= OPS
        early, late = low_quartiles(r["rss_samples"])
        assert late <= early * 1.03, (
            f"rank {r['rank']} grew after warm-up: low quartile of the resident size {early} bytes in "
            f"the first third of the samples, {late} in the last; samples {r['rss_samples']}"
        )
        early, late = low_quartiles(r["malloc_samples"])
        assert late <= early * 1.02, (
            f"rank {r['rank']} holds more malloc'd memory after warm-up: low quartile {early} bytes in the first "
            f"third of the samples, {late} in the last; samples {r['malloc_samples']}"
        )
        early, late = low_quartiles(r["block_samples"])
        assert late <= early + 300, (
            f"rank {r['rank']} holds more Python objects after warm-up: low quartile {early} blocks in the first "
            f"third of the samples, {late} in the last; samples {r['block_samples']}"
        )
        assert r["fds_end"] == r["fds_warm"], f"rank {r['rank']} leaked file descriptors: {r}"
    assert shm_entries() <= before, f"left in /dev/shm: {shm_entries() - before}"
    for r in reports:
        for key in ("rss_samples", "malloc_samples", "block_samples"):
            r[key] = len(r[key])
    print("soak:", json.dumps(reports))
