"""Grouped allreduces of host tensors travel packed into one buffer (hvdlite/torch/packed_groups.py): results equal
the member-by-member sums, in place and into new tensors, strided members and several dtypes included; and a
disagreement between ranks, the same total size laid out differently included, fails on every rank with the error
a member-by-member group gives (tests/jobs/packed_groups.py)."""

import pytest
from multiproc import run_job_function


@pytest.mark.timeout(150)
@pytest.mark.parametrize("np", [2, 3])
def test_packed_groups_reduce_like_their_members_and_fail_like_them(np):
    run_job_function("packed_groups", np=np, timeout=120)
