"""A job written as a script (its top level runs): tests/test_job_harness.py checks that its assertions are
explained too. argv[1]: the rank that fails."""

import os
import sys

rank = int(os.environ["HVDLITE_RANK"])
expected = [rank, rank]
got = [rank, rank + (rank == int(sys.argv[1]))]
assert got == expected
