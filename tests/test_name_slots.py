"""The names' slots: a named asynchronous allreduce submitted again and again goes through its name's slot
(hvdlite_core/src/runtime/fast_slots.h) with no entry, queue or handle-table row of its own. Results, a name in
flight, mismatches between ranks, shutdown and a second init, across real processes; the slots' own bookkeeping is
in the core's unit tests (hvdlite_core/tests/slot_tests.cc)."""

from __future__ import annotations

import pytest
from hvdjob import assert_job_ok
from multiproc import job_source, run_job

CASES = [("shm-np2", 2, None), ("tcp-2hosts-np3", 3, [0, 1, 0])]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_name_slots_across_processes(case):
    _, np, host_ids = case
    rounds = 6
    result = run_job(job_source("name_slots"), np=np, host_ids=host_ids, args=[str(rounds)], timeout=100)
    steady, duplicates, mismatch, dtype_mismatch, sets, shutdown, second_runtime = (
        rounds * 6 + 1,
        2,
        1 + 4 + 1,
        4 + 1,
        rounds * 6 + 2 + 3 + 1,  # one set's steps at least, both sets counted, the removal and after it
        2,
        4 * 6 + 1,
    )
    total = steady + duplicates + mismatch + dtype_mismatch + sets + shutdown + second_runtime
    assert_job_ok(result, np, min_count=total)
