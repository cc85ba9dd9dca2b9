"""A rank that never ends on its own: it joins the job, records its pid and job id, then allreduces until it is
stopped. tests/test_lifeline.py kills the launcher and checks that the ranks follow it.

``python lifeline_job.py DIR`` under any launcher, or ``run_forever(DIR)`` as ``hvdlite.run``'s function."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run_forever(out_dir: str) -> None:
    import numpy as np
    from numpy_collectives import allreduce

    from hvdlite.common import basics

    basics.init()
    rank = basics.rank()
    data = np.ones(1024, dtype=np.float32)
    allreduce(data, "lifeline.first")
    with open(os.path.join(out_dir, "rank%d.tmp" % rank), "w") as f:
        f.write("%d %s\n" % (os.getpid(), os.environ.get("HVDLITE_JOB_ID", "")))
    os.replace(os.path.join(out_dir, "rank%d.tmp" % rank), os.path.join(out_dir, "rank%d" % rank))
    step = 0
    while True:
        allreduce(np.ones(1024, dtype=np.float32), "lifeline.%d" % (step % 4))
        step += 1
        time.sleep(0.01)


if __name__ == "__main__":
    run_forever(sys.argv[1])
