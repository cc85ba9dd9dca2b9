"""One rank of ``hvdlite.spark.run``: ``python -m hvdlite.spark.rank --parent PID --job ID``, started by its Spark
task (task.py) with the rank's environment.

It runs ``hvdlite.run(fn)``'s rank program (``hvdlite.runner.api.run_rank_function``) after tying its life to
the task's: when Spark kills the task's Python worker (a cancelled job, a lost executor), the kernel kills this
process too (``PR_SET_PDEATHSIG``), so no rank outlives its task. ``--job`` only names the job on the command line.
"""

import argparse
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """SIGKILL when the process that started us exits; exits at once if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the task ended before the line above took effect
        sys.exit(1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdlite.spark.rank")
    parser.add_argument("--parent", type=int, required=True, help="pid of the Spark task that started this rank")
    parser.add_argument("--job", required=True, help="the job's id (for ps and the logs)")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    from hvdlite.runner.api import run_rank_function

    return run_rank_function()


if __name__ == "__main__":
    sys.exit(main())
