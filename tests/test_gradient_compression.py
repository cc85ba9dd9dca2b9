"""PowerSGD and top-k compression with error feedback (hvdlite.torch.gradient_reducers), across real processes."""

import pytest
from multiproc import run_job_function

from hvdlite.common import compression_trial


def run(job, np=2, args=(), timeout=120):
    """Runs tests/jobs/<job>.py on np ranks; a failed assertion fails the test with the rank's explanation."""
    return run_job_function(job, np, args=args, timeout=timeout)


@pytest.mark.timeout(150)
def test_powersgd_recovers_a_low_rank_average_exactly_in_one_step():
    run("compression_powersgd_low_rank")


@pytest.mark.timeout(150)
def test_error_feedback_keeps_the_sum_of_applied_updates_equal_to_the_sum_of_true_gradients():
    run("compression_error_feedback")


@pytest.mark.timeout(150)
def test_a_failed_compressed_exchange_leaves_gradient_and_residual_as_they_were():
    run("compression_failed_exchange")


@pytest.mark.timeout(150)
def test_a_trial_keeps_compression_only_where_it_shortens_the_step():
    run("compression_trial")


def test_the_wait_for_the_exchange_bounds_what_compression_could_gain(monkeypatch):
    """Compression cannot shorten a step by more than the step waited for its exchange, and it adds its own work:
    where even a step without that wait but with that work would not be min_step_speedup times shorter, the trial
    decides against compressing after its uncompressed steps; otherwise, or when a rank could not say how long it
    waited, the compressed steps run. The wait is each step's least over the ranks: what a rank waited beyond it
    was for a slower rank's backward, which compression would not shorten."""
    clock = [0.0]
    monkeypatch.setattr(compression_trial.time, "perf_counter", lambda: clock[0])

    def trial_after_uncompressed_steps(waits, work=None, other_waits=None):
        """One rank's trial; other_waits: a second rank's waits (each step's), which `agree` combines with it."""
        trial = compression_trial.CompressionTrial(start_iter=2, min_step_speedup=1.25, trial_steps=4, kind="x")
        assert trial.trial_from == 5
        agreed = []

        def agree(values, least=False):
            agreed.append((list(values), least))
            if other_waits is None:  # one rank: its own figures
                return values
            if least:  # the other rank's waits of steps 2-5, and complete
                return [min(a, b) for a, b in zip(values, [other_waits(i) for i in range(2, 6)] + [1.0])]
            return values  # the same step times and work on both

        for iteration in range(1, 6):
            clock[0] += 0.060
            assert trial.measures_work(iteration) == (iteration == 5)
            trial.step_done(iteration, agree, waits(iteration), work if iteration == 5 else None)
        return trial, agreed

    trial, agreed = trial_after_uncompressed_steps(lambda i: 0.005)  # at most 60 / 55 = 1.09x shorter
    assert trial.decision is False and not trial.compresses(6) and not trial.shadows(6)
    # Steps 2-5 are timed (step 1 has no start): their waits, the least over the ranks, then the averages.
    assert agreed == [
        ([pytest.approx(0.005)] * 4 + [1.0], True),
        ([pytest.approx(0.060), pytest.approx(0.005), 0.0], False),
    ]
    assert trial.state()["compressed_seconds"] is None and trial.state()["plain_seconds"] == pytest.approx(0.060)
    trial, _ = trial_after_uncompressed_steps(lambda i: 0.030)  # up to 2x: worth trying
    assert trial.decision is None and trial.shadows(6) and trial.waited_seconds == pytest.approx(0.030)
    trial, agreed = trial_after_uncompressed_steps(lambda i: 0.030, work=0.030)  # 60 / (60 - 30 + 30): no gain
    assert trial.decision is False and trial.work_seconds == pytest.approx(0.030) and not trial.compresses(6)
    assert agreed[1] == ([pytest.approx(0.060), pytest.approx(0.030), pytest.approx(0.030)], False)
    trial, _ = trial_after_uncompressed_steps(lambda i: 0.030, work=0.005)  # 60 / 35 = 1.7x: still worth trying
    assert trial.decision is None and trial.shadows(6)
    trial, agreed = trial_after_uncompressed_steps(lambda i: None if i == 3 else 0.005)  # one step unknown
    assert trial.decision is None and trial.shadows(6) and agreed[0] == ([-1.0] * 4 + [0.0], True)
    # This rank waited 30 ms a step, but the other only 5, 10, 5 and 5 (it finished its backward 25 ms later in
    # most steps): the exchange itself kept the steps waiting 5 ms (the median of the least), so no.
    trial, _ = trial_after_uncompressed_steps(lambda i: 0.030, other_waits=lambda i: 0.010 if i == 3 else 0.005)
    assert trial.decision is False and trial.waited_seconds == pytest.approx(0.005)
    # The slower rank alternates: every step, one of the ranks waited only for the exchange.
    trial, _ = trial_after_uncompressed_steps(
        lambda i: 0.030 if i % 2 else 0.005, other_waits=lambda i: 0.005 if i % 2 else 0.030
    )
    assert trial.decision is False and trial.waited_seconds == pytest.approx(0.005)
    # Both waited 30 ms or more in every step: the link's, worth trying.
    trial, _ = trial_after_uncompressed_steps(lambda i: 0.040, other_waits=lambda i: 0.030)
    assert trial.decision is None and trial.shadows(6) and trial.waited_seconds == pytest.approx(0.030)


def test_a_trial_ends_at_once_where_compressed_steps_are_not_shorter_or_far_shorter(monkeypatch):
    """For compression from the first compressed step on, when the compressed steps' median is EARLY_MARGIN times
    beyond min_step_speedup; against it from the second, when even the fastest was not halfway there (by less than
    its square root shorter than the uncompressed median); otherwise the trial goes on (a slow first compressed step
    alone does not end it)."""
    clock = [0.0]
    monkeypatch.setattr(compression_trial.time, "perf_counter", lambda: clock[0])

    def trial_with(compressed_steps):
        trial = compression_trial.CompressionTrial(start_iter=2, min_step_speedup=1.25, trial_steps=4, kind="x")
        for iteration in range(1, 6):  # uncompressed, 60 ms each, half of it waiting: up to 2x shorter
            clock[0] += 0.060
            trial.step_done(iteration, lambda values, least=False: values, 0.030)
        for iteration, seconds in enumerate(compressed_steps, start=6):
            if trial.decision is not None:
                break
            assert trial.shadows(iteration)
            clock[0] += seconds
            trial.step_done(iteration, lambda values, least=False: values)
        return trial

    assert trial_with([0.070, 0.061]).decision is False  # neither shorter
    assert trial_with([0.056, 0.058]).decision is False  # 60 / 56 = 1.07x: short of the square root of 1.25 (1.118)
    assert trial_with([0.020, 0.025]).decision is True  # 3x shorter: beyond 2 x 1.25, decided on the first
    assert trial_with([0.020, 0.025]).state()["compressed_steps"] == 1
    assert trial_with([0.070]).decision is None  # one step is not enough to say no
    undecided = trial_with([0.120, 0.050])  # one 1.2x shorter, past halfway, not yet by enough: the trial goes on
    assert undecided.decision is None and undecided.shadows(8)
    assert trial_with([0.120, 0.050, 0.050, 0.050]).decision is False  # 60 / 50 = 1.2x: short of 1.25 at the end


@pytest.mark.timeout(200)
def test_training_converges_with_compression():
    out = run(
        "compression_training_converges",
        timeout=180,
    )
    assert out.count("accuracy") == 6, out


@pytest.mark.timeout(150)
def test_compression_errors_and_process_sets():
    run(
        "compression_errors_and_process_sets",
        np=3,
    )


@pytest.mark.timeout(150)
def test_elastic_state_commits_and_restores_residuals_and_warm_start():
    run("compression_elastic_state")


@pytest.mark.timeout(150)
def test_timeline_records_what_compression_local_sgd_and_staleness_did(tmp_path):
    path = tmp_path / "timeline.json"
    run("compression_timeline_counters", args=[str(path)])
    from hvdlite.timeline import check, load

    events = load(str(path))
    assert check(events) == []
    counters = {}
    for event in events:
        if event.get("ph") == "C":
            counters.setdefault(event["name"], []).append(event["args"])
    dense = (64 * 32 + 32) * 4
    assert [c["dense_bytes"] for c in counters["powersgd"]] == [dense] * 4, counters["powersgd"]
    # Step 1 is a start_iter step (everything sent); then the matrix travels as P and Q of rank 1.
    assert [c["sent_bytes"] for c in counters["powersgd"]] == [dense] + [(64 + 32 + 32) * 4] * 3
    assert counters["powersgd"][-1]["compression_ratio"] > 10
    assert [c["compressing"] for c in counters["powersgd"]] == [0, 1, 1, 1]
    assert [c["sent_bytes"] for c in counters["topk"]][1:] == [(41 * 12) + 32 * 4] * 3, counters["topk"]
    assert [c["averaged_bytes"] for c in counters["local_sgd"]] == [0, dense, 0, dense]
    assert [c["steps_since_average"] for c in counters["local_sgd"]] == [1, 0, 1, 0]
    # Staleness 2: two exchanges in flight before the first average is applied at step 3.
    assert [c["in_flight"] for c in counters["staleness"]] == [1, 2, 2, 2], counters["staleness"]
    assert [c["applied_bytes"] for c in counters["staleness"]] == [0, 0, dense, dense]
    assert {c["bound"] for c in counters["staleness"]} == {2}
