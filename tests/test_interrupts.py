"""A rank blocked in a collective can always be interrupted: signal handlers run while ranks wait on each
other (Ctrl-C raises KeyboardInterrupt, a SIGALRM timeout fires), the interrupted operation stays pending with its
buffers alive, and the runtime goes on working."""

from __future__ import annotations

import pytest
from multiproc import run_job_function


@pytest.mark.timeout(90)
def test_blocked_collectives_yield_to_signal_handlers_and_stay_usable():
    out = run_job_function("interrupted_waits", np=2, timeout=60)
    assert "INTERRUPTED BOTH" in out, out


@pytest.mark.timeout(120)
def test_tensorflow_eager_collective_yields_to_signal_handlers():
    run_job_function("interrupted_tf", np=2, timeout=90)


@pytest.mark.timeout(120)
def test_ranks_out_of_step_fail_on_every_rank_naming_both_collectives():
    np = 3  # rank 0 against two ranks in the other collective (the 2-rank case is the same code, minus one)
    run_job_function("out_of_step", np=np, env={"HVDLITE_DESYNC_TIMEOUT_SECONDS": "2"}, timeout=90)
