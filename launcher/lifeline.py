"""Local ranks die with the process that started them.

Remote ranks have a lifeline already (their ssh session ends with the launcher). Local ranks run in their own
sessions, so a launcher killed with SIGKILL (the OOM killer, a scheduler's hard stop) would leave them running,
reparented to init, with nobody reading their output. ``PR_SET_PDEATHSIG`` does not cover this well: it follows
the thread that forked, not the process, and reaches only the rank itself, not what the rank started.

So the launcher starts one small watcher process per launcher, in a session of its own (a signal to the
launcher's process group does not reach it), holding the read end of a pipe whose write end only the launcher
has. The launcher tells it each rank it starts (``watch PID``) and each rank it has reaped (``release PID``).
When the pipe reaches end of file, the launcher is gone, however it died: the watcher sends SIGTERM to the
process group of every rank still watched, waits up to a second, sends SIGKILL, and exits. A normal exit of the
launcher has reaped every rank, so the watcher finds nothing to stop.

This file runs as the watcher with ``python -I -S lifeline.py LAUNCHER_PID``: standard library only, so it
starts quickly and does not import hvdlite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, Optional

_GRACE_SECONDS = 1.0  # SIGTERM to SIGKILL: well inside the 2 s in which a rank must follow its launcher


# ---------------------------------------------------------------------------
# The launcher's side
# ---------------------------------------------------------------------------


class Lifeline:
    """The launcher's end of the pipe; the watcher starts on the first :meth:`watch`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._write_fd: Optional[int] = None
        self._watcher: Optional[subprocess.Popen] = None
        self._broken = False

    def watch(self, pid: int) -> None:
        """Stop this rank's process group if the launcher dies before it has reaped the rank."""
        self._send("watch %d\n" % pid)

    def release(self, pid: int) -> None:
        """The rank has been reaped: its pid may now belong to someone else."""
        self._send("release %d\n" % pid)

    def _send(self, line: str) -> None:
        with self._lock:
            if self._broken:
                return
            if self._write_fd is None and not self._start():
                return
            try:
                os.write(self._write_fd, line.encode())
            except OSError:
                # The watcher is gone (killed with us in mind, or never ran): the ranks lose this safety net,
                # nothing else changes.
                self._broken = True

    def _start(self) -> bool:
        if not sys.platform.startswith("linux"):
            self._broken = True  # the watcher needs /proc to tell a rank from a process that reused its pid
            return False
        read_fd, write_fd = os.pipe()  # both close on exec: only the watcher gets the read end, as its stdin
        try:
            self._watcher = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        except OSError:
            os.close(write_fd)
            self._broken = True
            return False
        finally:
            os.close(read_fd)
        self._write_fd = write_fd
        # A process forked from the launcher (a data loader, a pool) must not keep the pipe open after the
        # launcher dies, or the watcher would never see the end of file.
        os.register_at_fork(after_in_child=self._forget_in_child)
        return True

    def _forget_in_child(self) -> None:
        if self._write_fd is not None:
            try:
                os.close(self._write_fd)
            except OSError:
                pass
        self._write_fd = None
        self._broken = True
        self._lock = threading.Lock()  # the parent's may have been held by another thread at fork time


LIFELINE = Lifeline()


# ---------------------------------------------------------------------------
# The watcher
# ---------------------------------------------------------------------------


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _stop_groups(launcher_pid: int, watched: Dict[int, str]) -> None:
    # A pid whose start time changed was reaped and reused by another process: leave that one alone.
    groups = [pid for pid, started in watched.items() if _start_time(pid) == started]
    if not groups:
        return
    sys.stderr.write(
        "hvdlite: the launcher (pid %d) is gone; stopping its %d local rank(s) (pid %s)\n"
        % (launcher_pid, len(groups), ", ".join(map(str, sorted(groups))))
    )
    sys.stderr.flush()
    for signum in (signal.SIGTERM, signal.SIGCONT):  # SIGCONT: a stopped rank would hold SIGTERM pending
        for pgid in groups:
            try:
                os.killpg(pgid, signum)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + _GRACE_SECONDS
    while time.monotonic() < deadline and any(_group_alive(pgid) for pgid in groups):
        time.sleep(0.02)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def watcher_main(launcher_pid: int) -> int:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # only the end of the pipe ends the watcher
    watched: Dict[int, str] = {}
    for line in sys.stdin.buffer:
        command, _, argument = line.decode(errors="replace").partition(" ")
        try:
            pid = int(argument)
        except ValueError:
            continue
        if command == "watch":
            started = _start_time(pid)
            if started is not None:
                watched[pid] = started
        elif command == "release":
            watched.pop(pid, None)
    _stop_groups(launcher_pid, watched)
    return 0


if __name__ == "__main__":
    sys.exit(watcher_main(int(sys.argv[1])))
