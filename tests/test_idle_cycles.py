"""The background thread's long sleep when the job is idle (HVDLITE_IDLE_CYCLE_TIME, runtime/background_loop.cc),
across real processes: an idle pause wakes each process far less often than one cycle per CYCLE_TIME, and work
after the pause, including a process set that leaves a sleeping rank out, completes at once and correctly. A job
whose collectives are all synchronous keeps the background thread asleep between its steps too."""

import re

import pytest
from multiproc import job_source, run_job

# Alone (tests/conftest.py): it counts context switches and times the wake-up after a pause.
pytestmark = pytest.mark.alone


def idle_figures(env, host_ids=None):
    result = run_job(job_source("idle_cycles"), np=3, host_ids=host_ids, env=env, timeout=90)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and out.count("DONE") == 3, out
    rows = [
        dict(step=int(m[0]), rank=int(m[1]), switches=int(m[2]), subset_s=float(m[3]), total_s=float(m[4]))
        for m in re.findall(r"IDLE step=(\d+) rank=(\d+) switches=(\d+) subset_s=([\d.]+) total_s=([\d.]+)", out)
    ]
    assert len(rows) == 9, out
    return rows


@pytest.mark.timeout(200)
@pytest.mark.parametrize("host_ids", [None, [0, 0, 1]], ids=["one-host", "two-hosts"])
def test_idle_job_sleeps_and_wakes_at_once(host_ids):
    lengthened = idle_figures({}, host_ids)
    # One cycle per CYCLE_TIME (1 ms) is over a thousand wake-ups in the 1 s pause; the long sleep is 10 ms.
    most_lengthened = max(r["switches"] for r in lengthened)
    assert most_lengthened < 600, lengthened
    if host_ids is None:  # the same job without the long sleep, for contrast (once: the transport does not matter)
        every_cycle = idle_figures({"HVDLITE_IDLE_CYCLE_TIME": "0"})
        assert most_lengthened * 2 < min(r["switches"] for r in every_cycle), (lengthened, every_cycle)
    # The first collective after the pause does not wait for a timer: a sleeping non-member is woken within
    # IDLE_CYCLE_TIME, members by their own submission.
    assert max(r["total_s"] for r in lengthened) < 0.5, lengthened


@pytest.mark.timeout(120)
def test_synchronous_steps_leave_the_background_thread_asleep():
    result = run_job(job_source("synchronous_steps"), np=2, timeout=90)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and out.count("DONE") == 2, out
    rows = [
        dict(steps=int(m[0]), seconds=float(m[1]), cycles=int(m[2]), taken_up=int(m[3]), rounds=int(m[4]))
        for m in re.findall(
            r"SYNC rank=\d+ steps=(\d+) seconds=([\d.]+) background_cycles=(\d+) taken_up=(\d+) rounds=(\d+)", out
        )
    ]
    assert len(rows) == 2, out
    for row in rows:
        # Each step's caller drives its own cycle. A background thread that kept its CYCLE_TIME tick beside these
        # steps would run a cycle every step or two; asleep, it runs a few dozen in all.
        assert row["cycles"] < row["steps"] / 6, rows
        # Asynchronous work after such a phase is taken up at once, within a compute shorter than the long sleep.
        # A push that did not wake the thread would leave most rounds to the long sleep's end. Now and then a
        # round needs a second cycle, which waits for the cycle tick (a rank's thread woke on its own timer and
        # began a cycle without the work), and the ranks' spinning delays it further, so a quarter may miss.
        assert row["taken_up"] >= row["rounds"] * 3 // 4, rows


@pytest.mark.timeout(150)
def test_runs_of_submissions_are_left_to_their_caller_for_a_bounded_time():
    result = run_job(job_source("submission_bursts"), np=2, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and out.count("DONE") == 2, out
    bursts = [(int(m[0]), int(m[1])) for m in re.findall(r"BURSTS rank=\d+ steps=(\d+) background_cycles=(\d+)", out)]
    assert len(bursts) == 2, out
    for steps, cycles in bursts:
        # A background thread that takes its tick during the submissions runs one or two cycles a step here (each
        # step submits for a few milliseconds, the tick is 1 ms); leaving them to the callers, it runs a few in all
        # (a tick whose watch falls while the submitting caller is off its CPU still runs one).
        assert cycles < steps, bursts
    answered = re.search(r"ANSWERED rank=0 seconds=([\d.]+) submitted=(\d+)", out)
    assert answered, out
    # Rank 1 arrives 50 ms late; a run of submissions puts the background thread's cycle off by IDLE_CYCLE_TIME
    # (10 ms) at most each time, so rank 0 sees the collective finish soon after. Unbounded, it would never finish.
    assert float(answered[1]) < 0.5, answered[0]
    short = [(int(m[0]), int(m[1])) for m in re.findall(r"SHORT rank=\d+ steps=(\d+) wakes=(\d+)", out)]
    assert len(short) == 2, out
    for steps, wakes in short:
        # After the pause the first step's submission wakes the thread; then the callers drive, and a submission
        # that finds a cycle under way leaves it asleep. Woken at every step, it would count hundreds here.
        assert wakes <= 3, short
