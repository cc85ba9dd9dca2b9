"""Shared pytest configuration and fixtures for the hvdlite test suite."""

from __future__ import annotations

import atexit
import collections
import os
import shutil
import sys
import tempfile

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TESTS_DIR)
# Make ``import hvdlite`` and ``import multiproc`` work however pytest is run.
for _path in (_REPO_ROOT, _TESTS_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import wheel_build  # noqa: E402
from multiproc import run_job as _run_job  # noqa: E402

# Jobs read the machine's tuned allreduce table (tuning/table_file.h), which tests write by hand or through the
# tuner. Written while the suite loads both cores, such a table would say little about the machine, yet a later
# training job or benchmark would trust it: the suite keeps its tables in a directory of its own, removed at the
# end, so every run starts as a fresh machine does (CI included) and the user's ~/.cache/hvdlite is left alone.
SUITE_ALGORITHM_CACHE = tempfile.mkdtemp(prefix="hvdlite-suite-algorithms-")
os.environ["HVDLITE_ALGORITHM_CACHE_DIR"] = SUITE_ALGORITHM_CACHE
atexit.register(shutil.rmtree, SUITE_ALGORITHM_CACHE, True)
# Likewise the MPI plugin, which the first MPI job compiles (hvdlite/common/mpi_plugin.py): every run of the suite
# builds it from the sources under test, as a fresh machine does.
SUITE_MPI_PLUGIN_CACHE = tempfile.mkdtemp(prefix="hvdlite-suite-mpi-plugin-")
os.environ["HVDLITE_MPI_PLUGIN_CACHE"] = SUITE_MPI_PLUGIN_CACHE
atexit.register(shutil.rmtree, SUITE_MPI_PLUGIN_CACHE, True)
# Jobs run more ranks than CI has cores. Each rank's default OpenMP pool would take every core, and ranks
# oversubscribed that way spin in each other's way. One compute thread a rank, as torchrun gives its ranks, unless
# the caller chose otherwise; hvdlite's own sharing (hvdlite/torch/compute_threads.py) has a test of its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def run_job():
    """The :func:`multiproc.run_job` helper: run a script as an N-rank job.

    ``run_job(script, np, host_ids=None, timeout=120, env=None, args=())``
    returns a :class:`subprocess.CompletedProcess` (text stdout/stderr).
    """
    return _run_job


# Two lanes, which make test runs side by side (pytest-xdist, -n 2). Most of the waiting lane's time is jobs waiting
# (out peer timeouts, restarts, ssh logins, Spark's and Ray's start-up) while a core stays idle, so those files
# share the machine with the rest of the suite; the Adasum and algorithm-table sweeps join them so that the two lanes
# take about as long (the suite takes as long as its longer lane). Each lane runs its tests one after another, in
# the usual order.
# Tests that need the machine to themselves (timing bounds, every /dev/shm entry) are marked `alone` and run
# afterwards in a serial pytest run.
WAITING_LANE = {
    "test_adasum.py",
    "test_algorithm_table.py",
    "test_chaos.py",
    "test_checkpoints.py",
    "test_elastic.py",
    "test_elastic_multihost.py",
    "test_error_travel.py",
    "test_errors.py",
    "test_interrupts.py",
    "test_lifeline.py",
    "test_multihost.py",
    "test_ray.py",
    "test_spark.py",
}
_wheels_lane = None  # the lane whose first test starts the wheel build, until it has


def lane(nodeid: str) -> str:
    return "waits" if os.path.basename(nodeid.split("::", 1)[0]) in WAITING_LANE else "main"


def pytest_xdist_make_scheduler(config, log):
    # xdist's own grouping (loadgroup) rewrites test ids in a way this pytest no longer reads: a scope scheduler
    # whose scopes are the lanes gives each worker one lane.
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(nodeid)

    return LaneScheduling(config, log)


def pytest_collection_finish(session):
    # The wheels build in the background (wheel_build.py) when the packaging tests will need them, from the start
    # of the lane that runs them: every xdist worker collects every test, but only one runs that lane.
    global _wheels_lane
    for item in session.items:
        if item.nodeid.startswith("tests/test_packaging.py") and "dist" in item.fixturenames:
            _wheels_lane = lane(item.nodeid)
            return


def pytest_runtest_setup(item):
    global _wheels_lane
    if _wheels_lane is not None and lane(item.nodeid) == _wheels_lane:
        _wheels_lane = None
        wheel_build.start()


# The time each lane's tests took (set-up, call and tear-down), summed in the controlling process from the
# workers' reports: the suite takes as long as its longer lane, so this says which to move a file out of.
_lane_seconds: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    _lane_seconds[lane(report.nodeid)] += report.duration


def pytest_terminal_summary(terminalreporter, config):
    if getattr(config.option, "numprocesses", None):
        lanes = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sorted(_lane_seconds.items()))
        terminalreporter.write_line(f"time in each lane: {lanes}")
