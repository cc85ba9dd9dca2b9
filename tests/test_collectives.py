"""Multi-rank correctness of every collective, dtype and size, on every transport.

Each test starts ONE job (ranks pay ~1.5 s each to import torch); the job script loops over all cases and
checks every result on every rank against a reference computed locally from every rank's (deterministic)
input. See tests/jobs/*.py for the cases.
"""

from __future__ import annotations

import os

import pytest
from hvdjob import assert_job_ok, usable_cpus
from multiproc import job_source, run_job

# (id, np, host_ids, env, level). "full": every op x dtype x size; "small": a reduced sweep.
SWEEPS = [
    ("default-np1", 1, None, {}, "full"),
    ("default-np2", 2, None, {"EXPECT_TRANSPORT": "shm"}, "full"),
    ("default-np3", 3, None, {"EXPECT_TRANSPORT": "shm"}, "full"),
    ("default-np4", 4, None, {"EXPECT_TRANSPORT": "shm"}, "small"),  # np2, np3 run the full sweep
    # two emulated hosts: pairs across hosts use TCP, pairs on one host shared memory
    ("tcp-2hosts-np4", 4, [0, 0, 1, 1], {"EXPECT_TRANSPORT": "tcp"}, "small"),
    # two-tier allreduce: reduce-scatter in each host, allreduce across, allgather in each host; hosts in
    # interleaved rank order (ranks 0 and 2 on one host) so that local and cross member orders differ from ranks;
    # Horovod's variable name
    (
        "hierarchical-2hosts-np4",
        4,
        [0, 1, 0, 1],
        {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_HIERARCHICAL_ALLGATHER": "1", "EXPECT_TRANSPORT": "tcp"},
        "small",
    ),
    # three hosts of two, so that the cross tier is a ring of three and a host receives slices of two others
    (
        "hierarchical-3hosts-np6",
        6,
        [0, 1, 2, 2, 1, 0],
        {"HVDLITE_HIERARCHICAL_ALLREDUCE": "1", "HVDLITE_HIERARCHICAL_ALLGATHER": "1"},
        "small",
    ),
    # TCP only, non-power-of-two
    ("tcp-only-np3", 3, None, {"HVDLITE_SHM_DISABLE": "1", "EXPECT_TRANSPORT": "tcp"}, "small"),
    # shared-memory rings without the single-copy (cross-memory attach) path
    ("shm-nocma-np3", 3, None, {"HVDLITE_CMA_DISABLE": "1", "EXPECT_TRANSPORT": "shm-nocma"}, "small"),
    # threshold 1 byte: single-copy (or, without CMA, the ring) even for 1-element tensors
    (
        "single-copy-always-np3",
        3,
        None,
        {"HVDLITE_SMALL_MESSAGE_BYTES": "1", "HVDLITE_SINGLE_COPY_ALLREDUCE": "1"},
        "small",
    ),
    # ... and with streaming stores into every result (STREAMING_STORE_BYTES=1: 16 MiB by default, so that only
    # this sweep's sizes and edges, down to one element, go through them)
    (
        "ring-always-np4",
        4,
        None,
        {
            "HVDLITE_SMALL_MESSAGE_BYTES": "1",
            "HVDLITE_CMA_DISABLE": "1",
            "HVDLITE_STREAMING_STORE_BYTES": "1",
            "EXPECT_TRANSPORT": "shm-nocma",
        },
        "small",
    ),
    # huge threshold: recursive doubling / binomial tree even for the large tensors; waiting callers with a spin
    # budget given (the job checks it is the one used)
    (
        "latency-algos-always-np3",
        3,
        None,
        {"HVDLITE_SMALL_MESSAGE_BYTES": str(1 << 30), "HVDLITE_SPIN_MICROSECONDS": "20"},
        "small",
    ),
    # the core named by its file: bound through cffi's ABI mode, as the manylinux wheel is, not the compiled module
    (
        "abi-binding-np2",
        2,
        None,
        {
            "HVDLITE_CORE_LIBRARY": os.path.join(
                os.path.dirname(os.path.dirname(__file__)), "hvdlite", "_hvdlite_core.so"
            ),
            "EXPECT_BINDING": "abi",
        },
        "small",
    ),
]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", SWEEPS, ids=[s[0] for s in SWEEPS])
def test_collective_sweep(case):
    _, np, host_ids, env, level = case
    result = run_job(job_source("collectives"), np=np, host_ids=host_ids, env=env, args=[level], timeout=170)
    assert_job_ok(result, np, min_count=250)


# The MPI backend (HVDLITE_CPU_OPERATIONS=mpi, which hvdlite-run --mpi sets): the same sweep, every dtype, with
# Open MPI's mpirun starting the ranks. (id, np, level)
MPI_SWEEPS = [("mpi-np2", 2, "full"), ("mpi-np3", 3, "small"), ("mpi-np4", 4, "small")]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", MPI_SWEEPS, ids=[s[0] for s in MPI_SWEEPS])
def test_collective_sweep_on_mpi(case):
    _, np, level = case
    result = run_job(
        job_source("collectives"), np=np, env={"EXPECT_BACKEND": "mpi"}, args=[level], timeout=170, launcher="mpi"
    )
    assert_job_ok(result, np, min_count=250)


# (id, np, host_ids, env)
FUSION_CACHE = [
    ("default-np3", 3, None, {}),
    ("default-np4", 4, None, {}),
    ("no-cache-np3", 3, None, {"HVDLITE_CACHE_CAPACITY": "0"}),
    ("cache4-eviction-np3", 3, None, {"HVDLITE_CACHE_CAPACITY": "4"}),
    ("cache4-tcp-2hosts-np4", 4, [0, 1, 0, 1], {"HVDLITE_CACHE_CAPACITY": "4"}),
    ("tiny-fusion-np3", 3, None, {"HVDLITE_FUSION_THRESHOLD": "256"}),
    # 300 names cached first: each block of votes spans several words and travels as a window
    ("windowed-votes-np3", 3, None, {"HVDJOB_CACHE_PREFILL": "300"}),
    ("windowed-votes-tcp-2hosts-np4", 4, [0, 1, 0, 1], {"HVDJOB_CACHE_PREFILL": "300"}),
    ("no-fusion-np2", 2, None, {"HVDLITE_FUSION_THRESHOLD": "0"}),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", FUSION_CACHE, ids=[c[0] for c in FUSION_CACHE])
def test_many_in_flight_fusion_and_cache(case):
    _, np, host_ids, env = case
    result = run_job(job_source("fusion_cache"), np=np, host_ids=host_ids, env=env, args=["6"], timeout=100)
    assert_job_ok(result, np, min_count=6 * 60)


# Fused groups run in pieces of whole members where each rank has a CPU of its own, else whole (runtime/fusion.h):
# the job checks the values and the core's count of pieces against the rule. Eager reduction off and a tensor limit
# above the largest member, so that every member rides in the group.
@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 3])
def test_fused_groups_run_in_pieces_of_whole_members(np):
    env = {"HVDLITE_EAGER_ALLREDUCE_BYTES": "0", "HVDLITE_FUSION_TENSOR_LIMIT": str(4 << 20)}
    result = run_job(job_source("fused_pieces"), np=np, env=env, timeout=100)
    found = assert_job_ok(result, np, min_count=3 * 3 * 15)
    pieces = {int(rest.split("pieces=")[1]) for rest in found.values()}
    assert len(pieces) == 1 and (pieces.pop() > 0) == (np <= usable_cpus()), found


# Eager small allreduces (runtime/eager.h): a budget the head alone holds (some small tensors ride along, the rest
# take the usual path), the default budget that holds them all in the head and a tail that some cycles carry and
# others not (runtime/vote_exchange.h), on shared memory and on TCP with a non-power-of-two job, and the path off.
# (id, np, host_ids, env, expect_eager, budget)
EAGER = [
    ("head-only-np2", 2, None, {"HVDLITE_EAGER_ALLREDUCE_BYTES": "256"}, "on", 256),
    ("default-np2", 2, None, {}, "on", 4096),
    ("default-np3", 3, None, {}, "on", 4096),
    ("default-tcp-np3", 3, [0, 1, 2], {}, "on", 4096),
    # 300 names cached first: the votes travel as windows (runtime/vote_exchange.h) beside the eager region
    ("windowed-votes-np2", 2, None, {"HVDJOB_CACHE_PREFILL": "300"}, "on", 4096),
    ("windowed-votes-tcp-np3", 3, [0, 1, 2], {"HVDJOB_CACHE_PREFILL": "300"}, "on", 4096),
    ("off-np2", 2, None, {"HVDLITE_EAGER_ALLREDUCE_BYTES": "0"}, "off", 0),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", EAGER, ids=[c[0] for c in EAGER])
def test_eager_small_allreduces(case, tmp_path):
    _, np, host_ids, env, expect, budget = case
    env = dict(env, HVDLITE_TIMELINE=str(tmp_path / "timeline.json"))
    result = run_job(job_source("eager"), np=np, host_ids=host_ids, env=env, args=[expect, str(budget)], timeout=100)
    assert_job_ok(result, np, min_count=300 + 6 * 50 + 400)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 3])
def test_repeated_inplace_allreduce_takes_no_stale_request(np):
    result = run_job(job_source("inplace_repeat"), np=np, timeout=100)
    assert_job_ok(result, np, min_count=50 + 6 + 4 + 12 + 5 + 3 + 3 + 1 + 1)


@pytest.mark.timeout(120)
def test_request_cache_keeps_one_entry_per_name_whatever_the_buffers():
    result = run_job(job_source("request_cache"), np=2, timeout=100)
    assert_job_ok(result, 2, min_count=300 * 12 + 1 + 3)


# The ring's reduction reads incoming bytes in place: streams shifted by stray bytes, on shared memory (ring
# forced, no single copy) and on TCP (bounce buffer, elements split across receives). Rings of more members
# on shared memory run in the sweeps above (default-np3, ring-always-np4).
RING_STREAMS = [
    ("shm-np2", 2, {"HVDLITE_CMA_DISABLE": "1"}),
    ("tcp-np3", 3, {"HVDLITE_SHM_DISABLE": "1"}),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", RING_STREAMS, ids=[c[0] for c in RING_STREAMS])
def test_ring_reduces_shifted_streams(case):
    _, np, env = case
    env = dict(env, HVDLITE_SMALL_MESSAGE_BYTES="1024", HVDLITE_ALLREDUCE_ALGORITHMS="fixed")
    result = run_job(job_source("ring_streams"), np=np, env=env, timeout=120)
    assert_job_ok(result, np, min_count=96)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("np", [2, 3])
def test_scaling_matches_horovods_rule(np):
    """prescale/postscale and integer Average, for every dtype, against a torch model of Horovod's rule."""
    result = run_job(job_source("scaling"), np=np, timeout=120)
    assert_job_ok(result, np, min_count=280)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("np", [2, 3])
def test_horovod_semantics(np):
    """join with cached names and after a failed step, alltoall's splits dtype, _parameter_names, None inputs."""
    result = run_job(job_source("horovod_semantics"), np=np, timeout=120)
    assert_job_ok(result, np, min_count=12 * np + 6)
