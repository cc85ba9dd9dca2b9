"""`make wheel`'s tool run in the background for test_packaging.py, started with the first test of the lane that
runs it (tests/conftest.py).

The build takes minutes, most of them Zig compiling libc++ for each target, while most of the suite leaves a core
idle as its jobs start up and wait on each other. Run at the lowest priority from the session's start, the build
takes only the CPU time the other tests leave, and is usually done by the time the packaging tests need it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_build = None


class _Build:
    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="hvdlite-suite-wheels-")
        self.dist = os.path.join(self.folder, "dist")
        os.mkdir(self.dist)
        self.log_path = os.path.join(self.folder, "build.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, os.path.join(REPO, "tools", "build_wheels.py"), "--outdir", self.dist],
                cwd=self.dist,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # one process group: stopped whole if the session ends first
                preexec_fn=lambda: os.nice(19),
            )
        atexit.register(self.discard)

    def wait(self, timeout: float) -> tuple:
        """(the folder holding the sdist and wheels, the tool's output); raises if the build failed."""
        try:
            returncode = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.discard()
            raise
        with open(self.log_path) as log:
            output = log.read()
        if returncode != 0:
            raise AssertionError("tools/build_wheels.py failed (%d):\n%s" % (returncode, output[-8000:]))
        return self.dist, output

    def discard(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start() -> None:
    """Starts the build unless it has started."""
    global _build
    if _build is None:
        _build = _Build()


def wait(timeout: float) -> tuple:
    start()
    return _build.wait(timeout)
