"""Reused buffers that peers read by single copy are moved onto transparent huge pages (common/huge_page_promotion.h),
across real processes: results stay exact, a buffer is collapsed on its second use (in place: one buffer; out of
place: input and output), the kernel's smaps shows huge pages under it, HUGE_PAGE_BYTES=0 or a larger threshold
turns it off, and a buffer allocated afresh for every use is collapsed at most once per address (the policy's
re-checks, giving up and stopping after wasted collapses are unit-tested with a fake kernel in
hvdlite_core/tests/unit_tests.cc)."""

from __future__ import annotations

import json

import pytest
from hvdjob import assert_job_ok
from multiproc import job_source, run_job

# Single copy for every allreduce (the fixed rules with single copy on), so the sizes need no measured table.
SINGLE_COPY = {"HVDLITE_SMALL_MESSAGE_BYTES": "1", "HVDLITE_SINGLE_COPY_ALLREDUCE": "1"}


def reports(env):
    result = run_job(job_source("huge_pages_report"), 2, env={**SINGLE_COPY, **env}, timeout=120)
    assert_job_ok(result, 2)
    found = {}
    for line in result.stdout.splitlines():
        if "REPORT " in line:
            rank, rest = line.split("REPORT ", 1)[1].split(" ", 1)
            found[int(rank)] = json.loads(rest)
    assert sorted(found) == [0, 1], result.stdout
    return found


def counts(text):
    # "3 collapsed, 0 refused, 1 given up, 2 wasted (stopped: ...)" -> (3, 0, 1) (wasted: see wasted())
    parts = [p.split() for p in text.split(",")]
    return tuple(int(p[0]) for p in parts[:3])


def wasted(text):
    return int(text.split(",")[3].split()[0])


def thp_mode():
    try:
        return open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "[never]"


@pytest.mark.timeout(200)
def test_reused_buffers_move_onto_huge_pages():
    if "[never]" in thp_mode():
        for report in reports({}).values():
            assert report["in_place"].startswith("off"), report
        return
    for rank, report in reports({}).items():
        collapsed, refused, given_up = counts(report["in_place"])
        assert (collapsed + refused, given_up) == (1, 0), report  # the in-place buffer, on its second use
        if refused == 0:  # the kernel moved it: its smaps says so
            assert report["huge_kb"] >= report["interior_kb"] > 0, report
        collapsed, refused, given_up = counts(report["out_of_place"])
        assert collapsed + refused == 3 and given_up == 0, report  # plus the input and the output
        assert wasted(report["out_of_place"]) == 0, report  # each reused several times since its collapse
        collapsed, refused, given_up = counts(report["fresh"])
        # A fresh array each use: collapsed at most once per address it came at (on its second use there), never at
        # every use. Where malloc kept the memory between uses the pages stay huge; where it gave them back, the
        # re-check finds small pages and gives that buffer up.
        assert 0 <= collapsed + refused - 3 <= report["fresh_addresses"], report
        assert given_up <= report["fresh_addresses"], report
        # Fresh arrays at new addresses are abandoned right after their collapse: wasted, and after three of those
        # the promoter stops collapsing (unit-tested in detail).
        assert wasted(report["fresh"]) <= 3, report


@pytest.mark.timeout(200)
@pytest.mark.parametrize("setting", ["0", str(64 << 20)])
def test_huge_page_bytes_turns_it_off(setting):
    for report in reports({"HVDLITE_HUGE_PAGE_BYTES": setting}).values():
        if "[never]" in thp_mode():
            assert report["fresh"].startswith("off"), report
        else:
            assert counts(report["fresh"]) == (0, 0, 0), report
