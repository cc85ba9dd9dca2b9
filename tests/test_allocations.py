"""A cached collective's steady state allocates nothing: every C++ heap allocation of a 2-rank job is counted
(hvdlite_core/tests/count_allocations.cc, loaded with LD_PRELOAD) while it runs named 1 KB allreduces step after
step, through the core's C ABI, hvdlite.torch's asynchronous calls, its synchronous allreduce_, one
grouped_allreduce_ of them all and a DistributedOptimizer step, and unnamed allreduce_ calls beside them
(tests/jobs/steady_state_allocations.py). A count,
not a time: it does not depend on the machine's load, and an allocation that creeps back into the per-tensor path
(a copied name, a map node, a response copied out of the cache, a new handle state) fails it at once. Likewise the
Python garbage collections those steps set off: Python objects kept per tensor through a step would make the
collector pass over the whole heap."""

import os
import re
import shutil
import subprocess

import pytest
from multiproc import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "jobs", "steady_state_allocations.py")
COUNTER = os.path.join(ROOT, "hvdlite_core", "tests", "count_allocations.cc")
MOST_PER_OPERATION = 0.2  # none per operation; room for what the job allocates now and then (a cycle's buffers)
# None per step; room for one set off by what the job allocates now and then. A tracked object kept per tensor
# through a step sets off one every 700 tensors.
MOST_COLLECTIONS_PER_STEP = 0.5


@pytest.fixture(scope="module")
def counter_library(tmp_path_factory):
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    library = tmp_path_factory.mktemp("alloc") / "libcount_allocations.so"
    subprocess.run([compiler, "-std=c++17", "-O2", "-shared", "-fPIC", COUNTER, "-o", str(library)], check=True)
    return str(library)


@pytest.mark.timeout(200)
def test_steady_state_collectives_allocate_nothing(counter_library):
    with open(JOB, encoding="utf-8") as f:
        result = run_job(f.read(), np=2, args=["1024", "4"], timeout=150, env={"LD_PRELOAD": counter_library})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for label, most in (("ALLOCATIONS", MOST_PER_OPERATION), ("COLLECTIONS", MOST_COLLECTIONS_PER_STEP)):
        lines = re.findall(label + r" rank=\d k=\d+ (.*)", out)
        assert len(lines) == 2, out
        for line in lines:
            figures = {way: float(n) for way, n in re.findall(r"(\w+)=([\d.]+)", line)}
            assert set(figures) == {"core", "async", "sync", "grouped", "optimizer", "unnamed"}, line
            assert all(n <= most for n in figures.values()), out
