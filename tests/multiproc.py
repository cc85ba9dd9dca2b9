"""Helper for tests that run a script as a multi-rank hvdlite job.

Usage (plain function)::

    from multiproc import run_job      # tests/ is on sys.path under pytest
    result = run_job('''
        import os
        print(os.environ["HVDLITE_RANK"])
    ''', np=2)
    assert result.returncode == 0, result.stdout + result.stderr

or through the ``run_job`` pytest fixture defined in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from typing import Mapping, Optional, Sequence, Union

#: Repository root (the directory that contains the ``hvdlite`` package).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Extra seconds the test waits on top of the job's own ``--timeout``; the
#: starter normally stops a hung job itself (exit 124) well before this.
TIMEOUT_SLACK = 15.0

#: Appended to job scripts: a script that reaches its end exits the way Python's own exit would (non-daemon
#: threads joined, atexit handlers run, hvdlite shut down, output flushed) but without tearing down the
#: interpreter, which with torch loaded costs about half a second per rank and decides nothing a test checks.
#: Interpreter teardown itself stays covered by the jobs started without this (examples, launcher tests) and
#: by ``fast_exit=False``.
FAST_EXIT_FOOTER = """

import atexit as _hvdlite_test_atexit, os as _hvdlite_test_os, sys as _hvdlite_test_sys
import threading as _hvdlite_test_threading
_hvdlite_test_threading._shutdown()
_hvdlite_test_atexit._run_exitfuncs()
_hvdlite_test_sys.stdout.flush()
_hvdlite_test_sys.stderr.flush()
_hvdlite_test_os._exit(0)
"""


def job_env(env: Optional[Mapping[str, str]] = None) -> dict:
    """``os.environ`` + ``env`` with the repository root first on PYTHONPATH."""
    result = dict(os.environ)
    if env:
        result.update(env)
    paths = [REPO_ROOT] + [p for p in result.get("PYTHONPATH", "").split(os.pathsep) if p and p != REPO_ROOT]
    result["PYTHONPATH"] = os.pathsep.join(paths)
    return result


def run_job(
    script: str,
    np: int,
    host_ids: Optional[Sequence[Union[int, str]]] = None,
    timeout: float = 120,
    env: Optional[Mapping[str, str]] = None,
    args: Sequence[str] = (),
    launcher: str = "local",
    fast_exit: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``script`` (Python source, dedented) as an ``np``-rank job.

    Starts ``python -m hvdlite.runner.local -np NP [--host-ids ...]
    --timeout TIMEOUT -- python SCRIPT *args`` from the repository root and
    returns a :class:`subprocess.CompletedProcess` with ``returncode`` and
    the starter's ``stdout`` and ``stderr`` (text, captured separately; rank
    output lines carry ``[<rank>]<stdout>: `` / ``[<rank>]<stderr>: ``
    prefixes).  ``env`` adds variables to the environment of the starter
    and hence of every rank.

    If the starter itself does not finish within ``timeout`` +
    ``TIMEOUT_SLACK`` seconds it is stopped (SIGTERM, which makes it stop its
    ranks, then SIGKILL) and :class:`subprocess.TimeoutExpired` is raised,
    so a hang fails the test instead of blocking the run.

    ``launcher="mpi"`` starts the job with ``hvdlite-run --mpi`` instead (Open MPI's mpirun starts the ranks,
    which bootstrap over mpi4py and move tensors through the MPI backend); its rank prefixes are rewritten to
    the built-in starter's, so the same checks read both.

    ``fast_exit`` appends FAST_EXIT_FOOTER (built-in starter only): a script that completes skips the
    interpreter's teardown.
    """
    with tempfile.TemporaryDirectory(prefix="hvdlite-job-") as tmp:
        script_path = os.path.join(tmp, "job_script.py")
        with open(script_path, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(script))
            if fast_exit and launcher == "local":  # mpi4py finalizes MPI in the interpreter's teardown
                f.write(FAST_EXIT_FOOTER)
        if launcher == "mpi":
            assert host_ids is None, "mpirun jobs run on this host"
            cmd = [
                sys.executable,
                "-m",
                "hvdlite.runner.launch",
                "--mpi",
                "-np",
                str(np),
                sys.executable,
                script_path,
                *[str(a) for a in args],
            ]
            # Unbuffered, print() writes text and newline apart, and Open MPI tags each write: lines would break.
            rank_env = {k: v for k, v in job_env(env).items() if k != "PYTHONUNBUFFERED"}
            result = _run_starter(cmd, rank_env, timeout + TIMEOUT_SLACK)
            result.stdout, result.stderr = _untag(result.stdout), _untag(result.stderr)
            return result
        cmd = [sys.executable, "-m", "hvdlite.runner.local", "-np", str(np)]
        if host_ids is not None:
            cmd += ["--host-ids", ",".join(str(h) for h in host_ids)]
        cmd += ["--timeout", str(timeout), "--", sys.executable, script_path, *[str(a) for a in args]]
        return _run_starter(cmd, job_env(env), timeout + TIMEOUT_SLACK)


def _untag(text: str) -> str:
    """Open MPI's ``[job,rank]<stdout>:text`` prefixes as the built-in starter's ``[rank]<stdout>: text``."""
    return re.sub(r"^\[\d+,(\d+)\]<(stdout|stderr)>:", r"[\1]<\2>: ", text, flags=re.MULTILINE)


def _run_starter(cmd: Sequence[str], env: Mapping[str, str], limit: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stdout, stderr = _stop_starter(proc)
        raise subprocess.TimeoutExpired(cmd, limit, output=stdout, stderr=stderr) from None
    except BaseException:  # e.g. ^C in pytest: do not leave the job behind
        _stop_starter(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _stop_starter(proc: subprocess.Popen):
    """Stop the starter and collect its remaining output.

    Not a plain SIGKILL (as subprocess.run() does on timeout): that would
    orphan the ranks, which run in their own sessions.  SIGTERM makes the
    starter stop its ranks first; SIGKILL only if it does not react.
    """
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def run_checked(
    script: str, np: int, marker: str = "DONE", timeout: float = 120, env: Optional[Mapping[str, str]] = None
) -> str:
    """Runs script on np ranks; asserts exit code 0 and that every rank printed marker. Returns the output."""
    result = run_job(script, np=np, timeout=timeout, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert out.count(marker) == np, out
    return out


JOBS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")
RANK_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>: ?(.*)$")


def run_job_function(
    target: str,
    np: int,
    args: Sequence[str] = (),
    timeout: float = 150,
    env: Optional[Mapping[str, str]] = None,
    host_ids: Optional[Sequence[Union[int, str]]] = None,
) -> str:
    """Runs ``MODULE:FUNCTION`` of tests/jobs/ (or a whole ``MODULE``) on np ranks through tests/jobs/run.py, which
    rewrites the job's assertions as pytest does. Returns the output when every rank passed; otherwise raises an
    AssertionError that gives each failed rank's traceback (with pytest's explanation of the failed assertion)
    before the job's whole output."""
    with open(os.path.join(JOBS_DIR, "run.py"), encoding="utf-8") as f:
        runner = f.read()
    env = dict(env or {}, HVDLITE_TEST_JOBS_DIR=JOBS_DIR)
    result = run_job(runner, np=np, args=[target, *args], timeout=timeout, env=env, host_ids=host_ids)
    out = result.stdout + result.stderr
    passed = {int(m.group(1)) for m in map(RANK_LINE.match, out.splitlines()) if m and m.group(3) == "OK " + target}
    if result.returncode == 0 and len(passed) == np:
        return out
    reports = {}
    for line in out.splitlines():
        match = RANK_LINE.match(line)
        if match and match.group(2) == "stderr":
            reports.setdefault(int(match.group(1)), []).append(match.group(3))
    failed = sorted(r for r in range(np) if r not in passed)
    summary = "%s: ranks %s of %d failed (exit code %d)" % (target, failed, np, result.returncode)
    details = [
        "--- rank %d ---\n%s" % (r, "\n".join(reports[r][-60:]))
        for r in failed
        if "Traceback" in "".join(reports.get(r, []))
    ]
    raise AssertionError("\n".join([summary] + details + ["--- whole output ---", out[-6000:]]))


def job_source(name: str) -> str:
    """The source of tests/jobs/<name>.py, for a job run without the harness (one that fails by design, or whose
    ranks print what the test then judges), with tests/ and tests/jobs/ on its path, as the harness gives a job."""
    with open(os.path.join(JOBS_DIR, name + ".py"), encoding="utf-8") as f:
        source = f.read()
    folders = [os.path.dirname(JOBS_DIR), JOBS_DIR]
    return "import sys\nsys.path[:0] = %r\n%s" % (folders, source)


def run_job_module(name: str, np: int, args: Sequence[str] = (), timeout: float = 150) -> str:
    """Runs the script tests/jobs/<name> on np ranks (run_job_function on the whole module). Returns the output."""
    return run_job_function(name[:-3] if name.endswith(".py") else name, np, args=args, timeout=timeout)
