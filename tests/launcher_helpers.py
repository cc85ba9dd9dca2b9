"""Helpers for tests that start jobs through the ``hvdlite-run`` console script."""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import List, Mapping, Optional, Sequence

import pytest
from multiproc import REPO_ROOT, job_env

# Every job script checks its collectives against values computed locally and prints one OK line per rank.
COLLECTIVE_SCRIPT = """
import os, sys
import torch
import hvdlite.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
total = hvd.allreduce(torch.tensor([float(r + 1), 2.0 * r]), op=hvd.Sum)
assert total.tolist() == [n * (n + 1) / 2, float(n * (n - 1))], total
gathered = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int64))
assert gathered[:, 0].tolist() == [k for k in range(n) for _ in range(k + 1)], gathered
info = dict(item.split("=", 1) for item in hvd.build_info().split(";") if "=" in item)
print("OK rank=%d size=%d local=%d/%d cross=%d/%d shm_peers=%s tcp_peers=%s" % (
    r, n, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(), info["shm_peers"],
    info["tcp_peers"]), flush=True)
hvd.shutdown()
"""

# Prints Horovod's placement variables as a script reads them before hvd.init() (e.g. to pick a GPU), and then
# what hvd.init() found; see check_horovod_variables.
HOROVOD_VARIABLES_SCRIPT = """
import os
names = ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME"]
before = " ".join("%s=%s" % (name, os.environ["HOROVOD_" + name]) for name in names)
import hvdlite.torch as hvd
hvd.init()
after = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
print("HOROVOD", before, "| init:", " ".join("%s=%d" % pair for pair in zip(names, after)),
      "| HVDLITE_HOSTNAME=" + os.environ["HVDLITE_HOSTNAME"], flush=True)
hvd.shutdown()
"""


def check_horovod_variables(stdout: str, hostnames: Sequence[str]) -> None:
    """Checks the lines of HOROVOD_VARIABLES_SCRIPT: rank r runs on hostnames[r]; every variable equals what
    hvd.init() says, and the expected value for that placement."""
    size = len(hostnames)
    hosts = list(dict.fromkeys(hostnames))
    found = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\[(\d+)\]<stdout>: HOROVOD (.*) \| init: (.*) \| HVDLITE_HOSTNAME=(.*)", line)
        if match:
            before = dict(pair.split("=", 1) for pair in match.group(2).split())
            after = dict(pair.split("=", 1) for pair in match.group(3).split())
            found[int(match.group(1))] = (before, after, match.group(4))
    assert sorted(found) == list(range(size)), stdout
    for rank, (before, after, hvdlite_hostname) in found.items():
        host = hostnames[rank]
        expected = {
            "RANK": str(rank),
            "SIZE": str(size),
            "LOCAL_RANK": str(hostnames[:rank].count(host)),
            "LOCAL_SIZE": str(hostnames.count(host)),
            "CROSS_RANK": str(hosts.index(host)),
            "CROSS_SIZE": str(len(hosts)),
        }
        assert after == expected, (rank, after, expected)
        assert before == dict(expected, HOSTNAME=host), (rank, before, expected)
        assert hvdlite_hostname == host


def hvdlite_run() -> str:
    """The installed console script (next to this interpreter)."""
    path = os.path.join(os.path.dirname(sys.executable), "hvdlite-run")
    if not os.access(path, os.X_OK):
        pytest.fail(
            "the hvdlite-run console script is not installed next to %s: run pip install -e . "
            "(make test does)" % sys.executable
        )
    return path


def write_script(directory, source: str, name: str = "job.py") -> str:
    path = os.path.join(str(directory), name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(source))
    return path


def run_launcher(
    args: Sequence[str], timeout: float = 60, env: Optional[Mapping[str, str]] = None, cwd: str = REPO_ROOT
) -> subprocess.CompletedProcess:
    """Runs ``hvdlite-run *args`` to completion (text output). Past ``timeout`` it is stopped the way a user
    would (SIGTERM: it stops its ranks), then killed, and the test fails."""
    proc = subprocess.Popen(
        [hvdlite_run(), *args],
        cwd=cwd,
        env=job_env(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = stop(proc)
        pytest.fail(
            "hvdlite-run %s did not finish in %g s\nstdout:\n%s\nstderr:\n%s"
            % (" ".join(args), timeout, stdout, stderr)
        )
    except BaseException:
        stop(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def stop(proc: subprocess.Popen):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


class LiveJob:
    """``hvdlite-run`` running in the background; its output lines are collected as they come so that a test
    can act while the job runs."""

    def __init__(self, args: Sequence[str], env: Optional[Mapping[str, str]] = None, cwd: str = REPO_ROOT):
        self.proc = subprocess.Popen(
            [hvdlite_run(), *args],
            cwd=cwd,
            env=job_env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.stdout: List[str] = []
        self.stderr: List[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, stream, sink: List[str]) -> None:
        for line in stream:
            sink.append(line)
            self.lines.put(line)

    def wait_for(self, predicate, count: int = 1, timeout: float = 30) -> List[str]:
        """The first ``count`` lines (stdout or stderr) for which ``predicate(line)`` holds."""
        found: List[str] = []
        deadline = time.monotonic() + timeout
        while len(found) < count:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                pytest.fail("expected output did not come within %g s; output so far:\n%s" % (timeout, self.output()))
            if predicate(line):
                found.append(line)
        return found

    def finish(self, timeout: float = 60) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            pytest.fail("hvdlite-run did not finish in %g s; output:\n%s" % (timeout, self.output()))
        for thread in self._threads:
            thread.join(timeout=5)
        return code

    def output(self) -> str:
        return "stdout:\n%s\nstderr:\n%s" % ("".join(self.stdout), "".join(self.stderr))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def processes_with_marker(marker: str) -> List[int]:
    """PIDs of live (non-zombie) processes whose command line contains ``marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmdline = f.read()
            with open("/proc/%s/stat" % entry, "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != b"Z":
            pids.append(int(entry))
    return pids


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


class TmuxPane:
    """A shell command running in a detached tmux pane of ``columns`` x ``lines``: a real terminal emulator
    whose screen (and scrollback) the test reads back. The pane has its own tmux server (socket in a fresh
    directory); it stays, untouched, after the command exits, until :meth:`close`."""

    def __init__(self, command: str, columns: int = 160, lines: int = 40, env: Optional[Mapping[str, str]] = None):
        if shutil.which("tmux") is None:
            pytest.fail("tmux is not installed; make test installs it (tools/system-packages.sh)")
        self.directory = tempfile.mkdtemp(prefix="hvdlite-tmux-")  # short: a socket path has ~100 bytes
        self._socket = os.path.join(self.directory, "socket")
        self._config = os.path.join(self.directory, "tmux.conf")
        with open(self._config, "w") as f:
            f.write("set -g status off\nset -g history-limit 10000\n")
        self._env = job_env(env)
        # The command waits until the pane is fully set up: tmux may drop what a pane writes at once.
        started = os.path.join(self.directory, "started")
        self._status = os.path.join(self.directory, "status")
        self._tmux(
            "new-session",
            "-d",
            "-x",
            str(columns),
            "-y",
            str(lines),
            "while [ ! -e %s ]; do sleep 0.02; done; %s; echo $? >%s.tmp; mv %s.tmp %s; exec sleep 3600"
            % (shlex.quote(started), command, *[shlex.quote(self._status)] * 3),
        )
        size = self._tmux("display-message", "-p", "#{pane_width}x#{pane_height}").strip()
        assert size == "%dx%d" % (columns, lines), size
        open(started, "w").close()

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-S", self._socket, "-f", self._config, *args],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=10,
            cwd=REPO_ROOT,
        )
        if out.returncode != 0:
            raise RuntimeError("tmux %s failed: %s" % (" ".join(args), out.stderr))
        return out.stdout

    def screen(self, scrollback: bool = False) -> List[str]:
        """The visible lines (with ``scrollback``: everything that scrolled off above them too), without the
        empty lines at the bottom."""
        lines = self._tmux("capture-pane", "-p", *(["-S", "-"] if scrollback else [])).split("\n")
        while lines and not lines[-1].strip():
            lines.pop()
        return lines

    def wait_for_screen(self, predicate, timeout: float = 30) -> List[str]:
        """The screen once ``predicate(lines)`` holds (fails the test after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.screen()
            if predicate(lines):
                return lines
            if time.monotonic() > deadline:
                pytest.fail(
                    "the terminal did not show what was expected within %g s; it shows:\n%s"
                    % (timeout, "\n".join(lines))
                )
            time.sleep(0.05)

    def exit_status(self, timeout: float = 60) -> int:
        """Waits for the command to end; its exit status."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(self._status):
            if time.monotonic() > deadline:
                pytest.fail(
                    "the command in the terminal did not end within %g s; it shows:\n%s"
                    % (timeout, "\n".join(self.screen()))
                )
            time.sleep(0.05)
        with open(self._status) as f:
            return int(f.read())

    def close(self) -> None:
        try:
            self._tmux("kill-server")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.directory, ignore_errors=True)
