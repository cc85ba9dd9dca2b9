"""Builds and runs the core's C++ unit tests (validation, response cache, eager layout, fusion plan, dtypes, HMAC,
out-of-step detection, the lost-peer report, the handshake's verdicts, receiving in place, copy_bytes, the
huge-page buffer and promotion, and the algorithm choice's rules and tuned table)."""

import concurrent.futures
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "hvdlite_core")
SOURCES = [
    "runtime/validation.cc",
    "runtime/message.cc",
    "runtime/response_cache.cc",
    "runtime/eager.cc",
    "runtime/fusion.cc",
    "runtime/desync.cc",
    "runtime/recent_ops.cc",
    "runtime/tensor_queue.cc",
    "runtime/fast_slots.cc",
    "runtime/handle_table.cc",
    "common/dtype.cc",
    "common/hmac_sha256.cc",
    "collectives/reduce_kernels.cc",
    "transport/lost_peers.cc",
    "transport/caller_spin.cc",
    "common/ordered_worker.cc",
    "choice/allreduce_table.cc",
    "choice/select.cc",
    "collectives/algorithm_names.cc",
    "transport/channel.cc",
    "transport/handshake.cc",
    "transport/socket_util.cc",
    "transport/shm_channel.cc",
    "transport/progress.cc",
    "transport/shm_segment.cc",
    "common/wait.cc",
    "common/copy_bytes.cc",
    "common/huge_page_buffer.cc",
    "common/huge_page_promotion.cc",
]
# The unit tests' own files (hvdlite_core/tests); tools/sanitize.sh builds the same lists.
TEST_SOURCES = [
    "unit_tests.cc",
    "algorithm_choice_tests.cc",
    "transport_tests.cc",
    "queue_tests.cc",
    "slot_tests.cc",
    "cache_tests.cc",
]


def _compile(compiler, source, obj):
    subprocess.run(
        compiler + ["-std=c++17", "-O1", "-Wall", f"-I{CORE}/include", f"-I{CORE}/src", "-c", source, "-o", obj],
        check=True,
    )


@pytest.mark.timeout(180)
def test_core_unit_tests(tmp_path):
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is required to build hvdlite"
    # One object per source, through ccache where setup.py would use it: a rerun on unchanged sources links only.
    launcher = [] if os.environ.get("HVDLITE_NO_CCACHE") == "1" or not shutil.which("ccache") else ["ccache"]
    sources = [os.path.join(CORE, "tests", f) for f in TEST_SOURCES]
    sources += [os.path.join(CORE, "src", s) for s in SOURCES]
    objects = [str(tmp_path / f"{i}.o") for i in range(len(sources))]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda pair: _compile(launcher + [compiler], *pair), zip(sources, objects)))
    binary = tmp_path / "unit_tests"
    subprocess.run([compiler] + objects + ["-o", str(binary)], check=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    print(result.stdout)
    assert result.returncode == 0, result.stdout
    assert " 0 failed" in result.stdout
