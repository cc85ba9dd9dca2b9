"""The code keeps one style, checked rather than argued: ruff's formatter and linter for Python (pyproject.toml) and
clang-format (.clang-format: Google's style with 118 columns) for C and C++. `make format` applies both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def tool(name: str) -> str:
    path = os.path.join(BIN, name)
    path = path if os.path.exists(path) else shutil.which(name)
    assert path, f"{name} is not installed (it comes with the dev extra: make test installs it)"
    return path


def tracked(*patterns: str) -> list:
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=REPO, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def test_c_and_cpp_sources_are_clang_formatted():
    files = tracked("*.cc", "*.h", "*.c")
    assert files
    result = subprocess.run(
        [tool("clang-format"), "--dry-run", "-Werror", *files], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, "not clang-formatted (run make format):\n" + result.stderr[-4000:]


def test_python_sources_are_ruff_formatted():
    result = subprocess.run([tool("ruff"), "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "not ruff-formatted (run make format):\n" + result.stdout[-4000:]


def test_python_sources_pass_ruff_check():
    result = subprocess.run([tool("ruff"), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "ruff check (make format fixes what it can):\n" + result.stdout[-4000:]
