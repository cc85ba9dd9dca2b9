"""Shared pytest configuration and fixtures for the hvdlite test suite."""

from __future__ import annotations

import os
import sys

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TESTS_DIR)
# Make ``import hvdlite`` and ``import multiproc`` work however pytest is run.
for _path in (_REPO_ROOT, _TESTS_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from multiproc import run_job as _run_job  # noqa: E402


@pytest.fixture
def run_job():
    """The :func:`multiproc.run_job` helper: run a script as an N-rank job.

    ``run_job(script, np, host_ids=None, timeout=120, env=None, args=())``
    returns a :class:`subprocess.CompletedProcess` (text stdout/stderr).
    """
    return _run_job
