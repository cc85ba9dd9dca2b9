"""Jobs that tests/test_job_harness.py runs to check the harness itself: one passes, one fails on the last rank
only, one fails inside a helper that it imports from tests/jobs/."""

import os

import numpy as np

RANK, SIZE = int(os.environ["HVDLITE_RANK"]), int(os.environ["HVDLITE_SIZE"])


def passes(expected_size):
    assert SIZE == int(expected_size)


def fails_on_last_rank():
    counts = {"rank": RANK, "steps": 3 if RANK < SIZE - 1 else 4}
    assert counts["steps"] == 3


def fails_in_a_helper():
    from harness_helper import assert_close

    assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
