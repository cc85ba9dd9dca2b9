"""Unnamed collectives are cached by what they carry (docs/decisions/024-caching-unnamed-collectives.md): a random
mix of a few recurring kinds, one to three in flight, each rank with its own pauses and order of synchronizing,
gives every call its own result. The errors of ranks whose unnamed calls differ are in tests/jobs/errors.py, the
cache hits themselves in test_timeline.py."""

import pytest
from multiproc import run_job_function


# The last case caches 300 other names first: the unnamed positions' vote then travels as a window over a block
# of several words, whose default every rank derives from the cache (runtime/vote_exchange.h).
@pytest.mark.timeout(120)
@pytest.mark.parametrize("np, seed, prefill", [(2, 1, 0), (3, 2, 0), (3, 3, 300)])
def test_unnamed_collectives_in_a_random_mix(np, seed, prefill):
    env = {"HVDJOB_CACHE_PREFILL": str(prefill)}
    run_job_function("unnamed_mix:main", np=np, args=["300", str(seed)], timeout=90, env=env)
