"""Errors travel: when user code raises on one rank, the other ranks' collectives fail naming that rank, its host
and its exception (not a bare "another rank shut hvdlite down")."""

from __future__ import annotations

import socket

import pytest
from hvdjob import prelude
from multiproc import run_job

UNCAUGHT = """
import atexit, time
import torch
import hvdlite.torch as hvd

# Registered before hvd.init, so it runs after hvdlite's exit handler: keeps the failing rank alive a moment
# so the launcher does not stop the others before they have printed what they saw.
atexit.register(time.sleep, 3)
hvd.init()
me = hvd.rank()
for step in range(3):
    hvd.allreduce(torch.ones(2), name="warmup", op=hvd.Sum)
if me == 1:
    def load_batch(index):
        raise ValueError(f"bad batch {index}")
    load_batch(7)
try:
    hvd.allreduce(torch.ones(2), name="next", op=hvd.Sum)
except hvd.HvdliteError as e:
    print(f"SURVIVOR {me} {type(e).__name__}: {e}", flush=True)
    later = None
    try:
        hvd.allreduce(torch.ones(2), name="later", op=hvd.Sum)
    except hvd.HvdliteError as e2:
        later = str(e2)
    print(f"LATER {me} {later}", flush=True)
    raise SystemExit(3)
raise AssertionError("the collective succeeded without rank 1")
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("np", [2, 3])
def test_uncaught_exception_is_named_in_the_other_ranks_errors(np):
    script = prelude() + UNCAUGHT
    result = run_job(script, np=np, timeout=60)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    line_number = script.splitlines().index('        raise ValueError(f"bad batch {index}")') + 1
    expected = (
        f"rank 1 on {socket.gethostname()} raised ValueError: bad batch 7 at job_script.py:{line_number} "
        "in load_batch; hvdlite stopped on every rank"
    )
    survivors = [r for r in range(np) if r != 1]
    for rank in survivors:
        line = next((text for text in out.splitlines() if f"SURVIVOR {rank} " in text), None)
        assert line is not None, out
        assert f"SURVIVOR {rank} AbortedError: {expected}" in line, line
    # The runtime stays stopped; later calls say so (it is not silently re-formed without rank 1).
    assert all(f"LATER {rank} None" not in out for rank in survivors), out
    assert "Traceback" in out and "ValueError: bad batch 7" in out, out  # the failing rank's own traceback


@pytest.mark.timeout(90)
def test_function_raising_under_hvdlite_run_is_named_in_the_other_ranks_errors(tmp_path):
    import hvdlite
    from hvdlite.runner.api import RunError

    def train_with_a_failing_rank(report_dir):
        import atexit
        import os
        import time

        import torch

        import hvdlite.torch as hvd

        atexit.register(time.sleep, 3)  # runs after hvdlite's exit handler: rank 0 writes before the job ends
        hvd.init()
        hvd.allreduce(torch.ones(1), name="warmup")
        if hvd.rank() == 1:
            time.sleep(0.5)
            raise KeyError("missing column 'label'")
        try:
            hvd.allreduce(torch.ones(1), name="next")
        except hvd.HvdliteError as e:
            with open(os.path.join(report_dir, "rank0.txt"), "w") as f:
                f.write(str(e))
            time.sleep(10)  # the launcher stops this rank once rank 1's failure ends the job
        return "finished"

    with pytest.raises(RunError) as failure:
        hvdlite.run(train_with_a_failing_rank, args=(str(tmp_path),), np=2, timeout=60)
    assert "KeyError" in str(failure.value)
    seen = (tmp_path / "rank0.txt").read_text()
    assert seen.startswith(
        f"rank 1 on {socket.gethostname()} raised KeyError: \"missing column 'label'\" at test_error_travel.py:"
    ), seen
    assert "in train_with_a_failing_rank; hvdlite stopped on every rank" in seen, seen
