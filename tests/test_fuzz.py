"""Fuzzing the negotiation wire format (hvdlite_core/tests/wire_fuzz.cc): valid, random and mutated messages
through the request and response decoders and the coordinator's validation, built with AddressSanitizer and
UndefinedBehaviorSanitizer. Every input must decode to in-range values or fail with a clean hvdlite::Error.

CI's short run: 300,000 inputs. ``HVDLITE_FUZZ_ITERATIONS`` sets the count; docs/faults.md records the long runs
(1,000,000 and 10,000,000 inputs)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "hvdlite_core")
SOURCES = ["runtime/message.cc", "runtime/validation.cc", "common/dtype.cc"]
ITERATIONS = int(os.environ.get("HVDLITE_FUZZ_ITERATIONS", "300000"))


@pytest.mark.timeout(300)
def test_wire_decoders_survive_mutated_messages(tmp_path):
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is required to build hvdlite"
    binary = tmp_path / "wire_fuzz"
    subprocess.run(
        [
            compiler,
            "-std=c++17",
            "-O1",
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            f"-I{CORE}/include",
            f"-I{CORE}/src",
            os.path.join(CORE, "tests", "wire_fuzz.cc"),
        ]
        + [os.path.join(CORE, "src", s) for s in SOURCES]
        + ["-o", str(binary)],
        check=True,
    )
    result = subprocess.run(
        [str(binary), str(ITERATIONS), "20261123"],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, ASAN_OPTIONS="abort_on_error=1"),
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{ITERATIONS} inputs" in result.stdout and "0 crashes" in result.stdout
    assert "runtime error" not in result.stderr, result.stderr  # a sanitizer report that did not abort
