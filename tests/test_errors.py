"""Error reporting across ranks: mismatches, bad arguments, peer death, stalls, shutdown and re-init."""

from __future__ import annotations

import re

import pytest
from hvdjob import assert_job_ok, ok_ranks
from multiproc import job_source, run_job


def detail(result) -> str:
    return (
        f"exit code {result.returncode}\n--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n"
        f"{result.stderr[-6000:]}"
    )


ERROR_CASES = [
    ("np2", 2, None, {}),
    ("np3", 3, None, {}),
    ("tcp-2hosts-np4", 4, [0, 0, 1, 1], {}),
    ("no-cache-np3", 3, None, {"HVDLITE_CACHE_CAPACITY": "0"}),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_mismatch_and_argument_errors(case):
    """MismatchError on every rank (dtype, shape, op, reduce op, root, pre/postscale, ...), with and without the
    name in the response cache; duplicate in-flight names; bad roots/splits/dtypes/devices; before init."""
    _, np, host_ids, env = case
    result = run_job(job_source("errors"), np=np, host_ids=host_ids, env=env, timeout=70)
    assert_job_ok(result, np, min_count=25)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("np", [2, 3])
def test_mismatch_and_argument_errors_on_mpi(np):
    """The same cases with the MPI backend moving the data (negotiation, which finds the mismatches, is the same)."""
    result = run_job(job_source("errors"), np=np, env={"EXPECT_BACKEND": "mpi"}, timeout=70, launcher="mpi")
    assert_job_ok(result, np, min_count=25)


# ------------------------------------------------------------------------------------------------ peer death


# (id, np, host_ids, where the survivors wait: a new collective, or the steady lane of a cached small one)
PEER_CASES = [
    ("shm-np2", 2, None, "queued"),
    ("tcp-np2", 2, [0, 1], "queued"),
    ("shm-np3", 3, None, "queued"),
    ("tcp-2hosts-np3", 3, [0, 1, 0], "queued"),
    ("lane-shm-np2", 2, None, "lane"),
    ("lane-shm-np3", 3, None, "lane"),
    ("slots-shm-np2", 2, None, "slots"),
    ("slots-tcp-2hosts-np3", 3, [0, 1, 0], "slots"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", PEER_CASES, ids=[c[0] for c in PEER_CASES])
def test_peer_death_is_reported_quickly(case):
    _, np, host_ids, waiting_in = case
    result = run_job(
        job_source("errors_peer_death"),
        np=np,
        host_ids=host_ids,
        env={"HVDLITE_PEER_TIMEOUT_SECONDS": "10"},
        args=[waiting_in] if waiting_in in ("lane", "slots") else [],
        timeout=40,
    )
    info = detail(result)
    assert result.returncode == 7, "the starter must exit with the dead rank's code\n" + info
    survivors = [r for r in range(np) if r != 1]
    errors = ok_ranks(result.stdout, "PEERERR")
    assert sorted(errors) == survivors, "every surviving rank must get an error\n" + info
    for r, rest in errors.items():
        kind, elapsed, message = rest.split(" ", 2)
        assert kind in ("PeerError", "HvdliteTimeoutError"), info
        assert float(elapsed) < 10.0, f"rank {r} took {elapsed} s to notice the dead peer\n" + info
        assert message.strip("'\""), f"rank {r}: empty error message\n" + info
        if waiting_in == "lane":  # the lane's operation never became an entry; the report still names it
            assert "allreduce 'lane.steady' (8 B, pending)" in message, f"rank {r}\n" + info
        if waiting_in == "slots":  # claimed from its slot, it is among the recent operations like any other
            assert re.search(r"allreduce 'slot\.\d' \(1 KB, pending\)", message), f"rank {r}\n" + info
    if np == 2:  # with two ranks the only peer rank 0 can be waiting on is the dead one
        assert re.search(r"rank 1\b", errors[0]), "rank 0's error should name the dead rank 1\n" + info
    after = ok_ranks(result.stdout, "AFTER")
    for r in survivors:
        assert r in after and after[r].startswith(("PeerError", "HvdliteTimeoutError", "AbortedError")), (
            f"rank {r}: a collective after the peer died must fail at once\n" + info
        )
        assert float(after[r].split()[1]) < 5.0, info
    shut = ok_ranks(result.stdout, "SHUTDOWN")
    assert sorted(shut) == survivors, "shutdown() after a peer died must return\n" + info


@pytest.mark.timeout(60)
def test_silent_peer_times_out_after_peer_timeout():
    """A peer that stops responding (SIGSTOP: connections stay open) fails the others' operations with
    HvdliteTimeoutError after HVDLITE_PEER_TIMEOUT_SECONDS, naming the silent rank."""
    result = run_job(job_source("errors_silent_peer"), np=2, env={"HVDLITE_PEER_TIMEOUT_SECONDS": "2"}, timeout=40)
    info = detail(result)
    found = ok_ranks(result.stdout, "SILENT")
    assert 0 in found, info
    kind, elapsed, message = found[0].split(" ", 2)
    assert kind == "HvdliteTimeoutError", info
    assert 1.5 < float(elapsed) < 10, info
    assert "rank 1" in message and "HVDLITE_PEER_TIMEOUT_SECONDS" in message, info


# ------------------------------------------------------------------------------------------------ stall


@pytest.mark.timeout(60)
def test_stalled_tensor_times_out_with_the_missing_ranks():
    """HVDLITE_STALL_SHUTDOWN_TIME_SECONDS fails a tensor some ranks never submit, naming the missing ranks.

    Bug: the stall check (Coordinator::report_stalls, called from decide() inside coordinate()) only runs in a
    cycle where some rank has new requests (Controller::negotiate, hvdlite_core/src/runtime/controller.cc:
    ``if ((any & kFlagRequests) || any_conflict || any_joined)``). In the usual hang -- every rank blocked,
    nobody submitting anything new -- neither the stall warning nor the stall shutdown ever fires, so the job
    hangs silently. (It fires as documented when other ranks keep submitting.)
    """
    result = run_job(job_source("errors_stall"), np=3, env={"HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"}, timeout=30)
    assert_job_ok(result, 3)
    stall = ok_ranks(result.stdout, "STALL")
    assert 2.5 < float(stall[0]) < 10, detail(result)


# ------------------------------------------------------------------------------------------------ shutdown


@pytest.mark.timeout(60)
def test_shutdown_then_calls_fail_and_init_again_works():
    result = run_job(job_source("errors_shutdown_reinit"), np=2, timeout=40)
    assert_job_ok(result, 2, min_count=3)


@pytest.mark.timeout(60)
def test_operation_pending_at_shutdown_fails_with_aborted_error():
    """shutdown()'s docstring: 'Pending operations on every rank fail with AbortedError'.

    Bug: hvdlite_shutdown (hvdlite_core/src/c_api.cc) destroys the Runtime and with it Runtime::handles_; the
    pending handle was failed with kAborted by fail_everything(), but afterwards hvdlite_wait() cannot find it
    (runtime_or_null() is null -> unknown_handle, status 2) and hvdlite_handle_error() returns no message, so
    synchronize() raises InvalidArgumentError('operation failed with status 2') instead of AbortedError.
    """
    result = run_job(job_source("errors_pending_at_shutdown"), np=2, timeout=40)
    assert_job_ok(result, 2, min_count=2)  # the last line of each rank: its second part passed too


# ------------------------------------------------------------------------------------------------ found bugs


@pytest.mark.timeout(60)
def test_rejected_unnamed_request_does_not_desynchronise_later_unnamed_collectives():
    """A request the core rejects on one rank must not consume an auto-generated name on that rank only.

    Bug: Runtime::check_request (hvdlite_core/src/runtime/runtime.cc) assigns
    ``<op>.noname.<unnamed_counter_++>`` before validating; when validation then fails on one rank only, that
    rank's later unnamed collectives get different names from the other ranks' and never match: a silent hang
    (the job below reports it after 8 s).
    """
    result = run_job(job_source("errors_rejected_unnamed"), np=2, timeout=30)
    assert_job_ok(result, 2)


@pytest.mark.timeout(60)
def test_grouped_call_with_an_invalid_member_leaves_nothing_in_flight():
    """A grouped call whose later member is rejected must not leave the earlier members enqueued.

    Bug: grouped_allreduce_async / grouped_allreduce_async_ / grouped_allgather_async /
    grouped_reducescatter_async (hvdlite/torch/mpi_ops.py) enqueue member by member; when member k raises
    (Python dtype/device check or the core's check), members 0..k-1 stay in flight in the core with pointers to
    tensors nobody keeps alive (use-after-free once they run; with every rank doing it this corrupted memory and
    crashed a rank with SIGSEGV), and their names stay taken.
    """
    result = run_job(job_source("errors_grouped_partial"), np=2, timeout=30)
    assert_job_ok(result, 2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("np", [2, 3])
def test_reinit_after_failures_in_a_loop(np):
    """shutdown() + init() in one process, 5 cycles, each after another kind of failure (mismatch, stall on
    every rank, stall of cached tensors on every rank, one rank shutting down under the others): every new
    runtime works, process sets included. A failure must not poison the later cycles."""
    result = run_job(job_source("reinit"), np=np, env={"HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"}, timeout=120)
    assert_job_ok(result, np, min_count=5)


# ------------------------------------------------------------------------------------- knobs that must agree


@pytest.mark.timeout(60)
def test_knobs_that_must_agree_are_compared_at_init_on_every_rank():
    """Fusion thresholds, cache capacity and algorithm thresholds set differently on some ranks would make ranks run
    different collectives; init refuses on every rank, naming each knob, its values and who has them."""
    result = run_job(job_source("errors_disagreeing_knobs"), np=3, timeout=40)
    refused = {}
    for line in result.stdout.splitlines():
        if "REFUSED" in line:
            rank, message = line.split("REFUSED ", 1)[1].split(" ", 1)
            refused[int(rank)] = message
    assert sorted(refused) == [0, 1, 2], result.stdout + result.stderr
    assert len(set(refused.values())) == 1, refused  # the same words everywhere
    message = refused[0]
    assert "HVDLITE_FUSION_THRESHOLD differs between ranks: 1024 on rank 2, 67108864 on ranks 0, 1" in message, (
        message
    )
    assert "HVDLITE_SMALL_MESSAGE_BYTES differs between ranks: 1 on rank 1, 65536 on ranks 0, 2" in message, message
    assert "Every rank must use the same value" in message
