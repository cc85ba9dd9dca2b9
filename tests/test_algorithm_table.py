"""The allreduce algorithms of a job on one host are chosen from measurements of this machine, cached per machine
(choice/algorithm_cache.h): measured by the first three jobs (the table comes from each figure's fastest of the
three), read by the next, obeyed by every rank, overridden by the fixed-rule knobs, and re-measured when the cache
file is damaged. Across real processes, with numpy buffers through the core; each run checks its results against a
reference at sizes on both sides of every band."""

from __future__ import annotations

import os

import pytest
from hvdjob import assert_job_ok
from multiproc import job_source, run_job


def infos(result) -> dict:
    found = {}
    for line in result.stdout.splitlines():
        if "INFO " in line:
            import json

            rank, rest = line.split("INFO ", 1)[1].split(" ", 1)
            found[int(rank)] = json.loads(rest)
    return found


def run(np_, cache_dir, host_ids=None, **env):
    env = {"HVDLITE_ALGORITHM_CACHE_DIR": str(cache_dir), **env}
    result = run_job(job_source("algorithm_table"), np_, host_ids=host_ids, env=env, timeout=120)
    assert_job_ok(result, np_)
    found = infos(result)
    assert sorted(found) == list(range(np_)), result.stdout
    assert all(found[r] == found[0] for r in found), found  # every rank runs the same table
    return found[0]


@pytest.mark.timeout(300)
def test_measured_by_the_first_jobs_read_by_the_next_and_obeyed(tmp_path):
    first = run(2, tmp_path)
    assert first["allreduce_table"] == "measured" and first["allreduce_table_measurements"] == "1", first
    path = first["allreduce_table_file"]
    assert os.path.dirname(path) == str(tmp_path) and os.path.exists(path), first
    header, key, bands, measurement = open(path).read().splitlines()
    assert header == "hvdlite allreduce table v3" and "ranks=2" in key and "processor=" in key, key
    assert bands == first["allreduce_algorithms"] and bands.startswith(("rd@0", "ring@0", "single_copy@0")), bands
    assert measurement.startswith("measured 4096:") and " streaming 16777216:" in measurement, measurement
    # The ring's store mode was measured too: streaming stores from the probe's 16 MiB, or from 64 MiB where
    # ordinary stores were clearly faster at 16 MiB (choice/streaming_choice.h).
    plain, streamed = (float(x) for x in measurement.split(" streaming 16777216:")[1].split(","))
    assert first["streaming_store_bytes_from"] == "measured", first
    # The threshold in effect is the vote's; the knob as read stays at its default.
    voted = str((64 if plain < 0.9 * streamed else 16) << 20)
    assert first["streaming_store_bytes"] == voted and first["STREAMING_STORE_BYTES"] == str(16 << 20), first
    # The online choice starts where the table first runs the ring or single copy, at 64 KiB at the least.
    starts = [int(band.split("@")[1]) for band in bands.split(",") if not band.startswith("rd@")]
    expected = max(64 << 10, starts[0]) if starts else None
    assert first.get("adaptive_allreduce") == (None if expected is None else str(expected)), (first, bands)

    # The next two jobs each add a measurement (a loaded moment cannot decide alone); then the table is read.
    for count in (2, 3):
        again = run(2, tmp_path, QUICK_CHECK="1")
        assert again["allreduce_table"] == "measured", again
        assert again["allreduce_table_measurements"] == str(count), again
        lines = open(path).read().splitlines()
        assert lines[:2] == [header, key] and lines[2] == again["allreduce_algorithms"], lines
        assert len(lines) == 3 + count and lines[3] == measurement, lines  # the older figures are kept
    fourth = run(2, tmp_path)
    assert fourth == dict(again, allreduce_table="cached", streaming_store_bytes_from="cached"), (again, fourth)
    # A cached file's store-mode figures vote again when it is read: three that say streaming stores lose at 16 MiB
    # move the threshold in effect to 64 MiB.
    lines = open(path).read().splitlines()
    for figures, expected in (("0.001,0.002", 64 << 20), ("0.002,0.001", 16 << 20)):
        voting = [line.split(" streaming ")[0] + " streaming 16777216:" + figures for line in lines[3:]]
        with open(path, "w") as f:
            f.write("\n".join(lines[:3] + voting) + "\n")
        read = run(2, tmp_path, QUICK_CHECK="1")
        assert read["allreduce_table"] == "cached" and read["streaming_store_bytes"] == str(expected), read

    # Another job size is another key: measured for itself.
    three = run(3, tmp_path)
    assert three["allreduce_table"] == "measured" and three["allreduce_table_file"] != path, three

    # A table written by hand is what every rank runs, algorithm by algorithm (the results are checked above
    # against the reference for each; large sizes are not chosen online here); the timeline names the algorithm
    # each allreduce ran.
    from hvdlite.timeline import activities, load

    for bands, expected in (
        ("ring@0", {1: "rd", 1000: "ring", (4 << 20) + 5: "ring"}),
        ("rd@0,single_copy@16384", {1000: "rd", 9000: "single_copy", 1 << 20: "single_copy"}),
        ("single_copy@0,ring@1000000", {1: "single_copy", 3: "single_copy", 300000: "ring"}),
    ):
        with open(path, "w") as f:
            f.write("%s\n%s\n%s\n" % (header, key, bands))
        timeline = tmp_path / "timeline.json"
        forced = run(2, tmp_path, HVDLITE_TIMELINE=str(timeline), HVDLITE_ADAPTIVE_ALLREDUCE_BYTES="0")
        assert forced["allreduce_table"] == "cached" and forced["allreduce_algorithms"] == bands, forced
        assert forced["allreduce_table_measurements"] == "0", forced  # written by hand: obeyed, never re-measured
        assert forced["streaming_store_bytes_from"] == "default", forced  # and no store-mode figures in it
        ran = activities(load(str(timeline)), "ALLREDUCE")
        for count, algorithm in expected.items():  # float32: 4 bytes an element
            assert ran["t.%d.float32.1" % count] == {"ALLREDUCE (%s)" % algorithm}, (bands, count, ran)


@pytest.mark.timeout(180)
def test_damaged_cache_is_measured_again_and_knobs_override(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICK_CHECK", "1")  # what is checked here is where the table came from
    first = run(2, tmp_path)
    path = first["allreduce_table_file"]
    good = open(path).read()
    measurement = good.splitlines()[3]
    for damage in (
        "",
        "hvdlite allreduce table v1\nsomething else\nring@0\n",
        good.replace("@0", "@5", 1),
        "garbage@@\n\n",
        good + "measured 4096:1,2\n",
        good + "by hand\n",
        good + (measurement + "\n") * 3,  # more than are kept
        good + measurement.replace("4096:", "8192:") + "\n",  # other probes
        # a complete file, but measured on another build's probe sizes: its table is not trusted
        "\n".join(good.splitlines()[:3] + [measurement.replace("4096:", "8192:")] * 3) + "\n",
        good + measurement.split(" streaming ")[0] + "\n",  # a v2 line: no store-mode figures
        good + measurement.replace("streaming 16777216:", "streaming 16777216:-") + "\n",
    ):
        with open(path, "w") as f:
            f.write(damage)
        again = run(2, tmp_path)
        assert again["allreduce_table"] == "measured", (damage, again)
        assert again["allreduce_table_measurements"] == "1", (damage, again)  # from scratch
        assert open(path).read().splitlines()[2] == again["allreduce_algorithms"]  # and rewritten
    # The fixed-rule knobs keep a user's tuning; ALLREDUCE_ALGORITHMS=fixed asks for the fixed rules outright.
    for env in (
        {"HVDLITE_SINGLE_COPY_ALLREDUCE": "1"},
        {"HOROVOD_SMALL_MESSAGE_BYTES": "1024"},
        {"HVDLITE_ALLREDUCE_ALGORITHMS": "fixed"},
    ):
        assert run(2, tmp_path, **env) == {
            "allreduce_table": "fixed",
            "streaming_store_bytes": str(16 << 20),
            "streaming_store_bytes_from": "default",
            "STREAMING_STORE_BYTES": str(16 << 20),
            "ALLREDUCE_ALGORITHMS": "fixed",
        }, env
    # STREAMING_STORE_BYTES given: obeyed, whatever the measurement says.
    given = run(2, tmp_path, HVDLITE_STREAMING_STORE_BYTES="12345")
    assert given["streaming_store_bytes_from"] == "knob" and given["streaming_store_bytes"] == "12345", given
    # An unwritable cache directory costs a measurement each time, never the job.
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    assert run(2, blocked / "sub")["allreduce_table"] == "measured"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("np_", [2, 3])
def test_large_allreduces_are_chosen_online_by_rank_0_for_every_rank(tmp_path, np_):
    """Every rank runs the algorithm rank 0 chose, allreduce by allreduce, trials included: the same sequence in
    every rank's timeline, right results, and both algorithms run (the other one is tried now and then)."""
    steps = 30
    timeline = tmp_path / "timeline-{rank}.json"
    result = run_job(
        job_source("algorithm_online_choice"),
        np_,
        timeout=200,
        env={
            "HVDLITE_ALGORITHM_CACHE_DIR": str(tmp_path),
            "STEPS": str(steps),
            "HVDLITE_ADAPTIVE_ALLREDUCE_BYTES": str(256 << 10),
            "HVDLITE_TIMELINE": str(timeline),
        },
    )
    assert_job_ok(result, np_, min_count=3 * steps)
    found = infos(result)
    assert sorted(found) == list(range(np_)), result.stdout
    assert all(found[r] == found[0] for r in found), found  # the same runs and switches on every rank
    runs = dict(kv.split(":") for kv in found[0]["adaptive_runs"].split(","))
    assert found[0]["adaptive_allreduce"] == str(256 << 10), found  # as set: three bands
    assert int(runs["ring"]) + int(runs["single_copy"]) == 3 * steps, found  # the 4 KB one is not among them
    assert int(runs["ring"]) > 0 and int(runs["single_copy"]) > 0, found  # each band tried the other algorithm
    from hvdlite.timeline import load, spans

    sequences = [
        [
            (tensor, activity)
            for tensor, activity, _, _ in spans(load(str(tmp_path / f"timeline-{r}.json")))
            if tensor.startswith("a.") and activity.startswith("ALLREDUCE")
        ]
        for r in range(np_)
    ]
    assert len(sequences[0]) == 3 * steps, sequences[0][:10]
    assert all(seq == sequences[0] for seq in sequences), [seq[:12] for seq in sequences]
    assert {a for _, a in sequences[0]} == {"ALLREDUCE (ring)", "ALLREDUCE (single_copy)"}, sequences[0]


# Float32 bytes of the job's counts; the timeline names each allreduce "t.<count>.float32.<op>".
JOB_COUNTS = (1, 3, 1000, 3001, 9000, 70001, 300000, 1 << 20, (4 << 20) + 5)


def algorithms_run(timeline) -> dict:
    from hvdlite.timeline import activities, load

    ran = activities(load(str(timeline)), "ALLREDUCE")
    return {count: ran["t.%d.float32.1" % count] for count in JOB_COUNTS}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "np_,host_ids",
    [(4, None), (3, [0, 1, 2]), (6, [0, 0, 0, 1, 1, 2])],
    ids=["4-shm", "3-tcp", "6-mixed"],
)
def test_recursive_halving_when_named(tmp_path, np_, host_ids):
    """ALLREDUCE_ALGORITHMS=rhd: every allreduce with at least an element per member of the largest power of two
    runs recursive halving and doubling (the smaller ones recursive doubling), its results checked by the job against
    the reference for every count, op and dtype: a power of two on shared memory, and with members folded in first
    over TCP and over both transports (6: two folded pairs, then two halving steps)."""
    timeline = tmp_path / "timeline.json"
    found = run(np_, tmp_path, host_ids, HVDLITE_ALLREDUCE_ALGORITHMS="rhd", HVDLITE_TIMELINE=str(timeline))
    assert found["ALLREDUCE_ALGORITHMS"] == "rhd" and found["allreduce_table"] == "fixed", found
    power_of_two = 1 << (np_.bit_length() - 1)
    expected = {count: {"ALLREDUCE (%s)" % ("rhd" if count >= power_of_two else "rd")} for count in JOB_COUNTS}
    assert algorithms_run(timeline) == expected


@pytest.mark.timeout(120)
def test_recursive_halving_where_the_model_prices_it_lowest(tmp_path):
    """Two emulated hosts of two ranks, flat allreduces, the link costs given: the chooser runs recursive halving and
    doubling for exactly the sizes of the band the cost model reports in build_info, and the size rule's algorithm
    elsewhere. Slow knobs for the network put the job's sizes on both sides of the band."""
    timeline = tmp_path / "timeline.json"
    env = {
        "HVDLITE_HIERARCHICAL_ALLREDUCE": "0",
        "HVDLITE_LOCAL_LATENCY_US": "2",
        "HVDLITE_LOCAL_GBYTES_PER_S": "8",
        "HVDLITE_CROSS_LATENCY_US": "500",
        "HVDLITE_CROSS_GBYTES_PER_S": "10",
        "HVDLITE_TIMELINE": str(timeline),
    }
    found = run(4, tmp_path, [0, 0, 1, 1], **env)
    start, end = (int(x) for x in found["allreduce_halving_bytes"].split("-"))
    ran = algorithms_run(timeline)
    inside = [count for count in JOB_COUNTS if start <= 4 * count < end]
    assert inside and len(inside) < len(JOB_COUNTS), (start, end)
    for count, algorithms in ran.items():
        if count in inside:
            assert algorithms == {"ALLREDUCE (rhd)"}, (count, ran)
        else:
            assert algorithms <= {"ALLREDUCE (rd)", "ALLREDUCE (ring)"} and len(algorithms) == 1, (count, ran)
    # The fixed rules have no band: recursive doubling, then the ring.
    fixed = dict(env, HVDLITE_ALLREDUCE_ALGORITHMS="fixed")
    assert "allreduce_halving_bytes" not in run(4, tmp_path, [0, 0, 1, 1], **fixed)
    assert {a for algorithms in algorithms_run(timeline).values() for a in algorithms} == {
        "ALLREDUCE (rd)",
        "ALLREDUCE (ring)",
    }


@pytest.mark.parametrize(
    "knob,value,differs",
    [
        ("ALLREDUCE_ALGORITHMS", "fixed", "measured on rank 0, fixed on rank 1"),
        ("ADAPTIVE_ALLREDUCE_BYTES", "0", "0 on rank 1, 65536 on rank 0"),
    ],
)
def test_ranks_must_agree_on_the_choice(tmp_path, knob, value, differs):
    result = run_job(
        job_source("algorithm_setting_refused"),
        2,
        args=[knob, value],
        env={"HVDLITE_ALGORITHM_CACHE_DIR": str(tmp_path)},
        timeout=60,
    )
    refused = [line for line in result.stdout.splitlines() if "REFUSED" in line]
    assert len(refused) == 2, result.stdout + result.stderr
    for line in refused:
        assert f"HVDLITE_{knob} differs between ranks: {differs}" in line, line


def test_an_unknown_setting_is_refused_by_name(tmp_path):
    result = run_job(
        job_source("algorithm_setting_refused"), 1, env={"HVDLITE_ALLREDUCE_ALGORITHMS": "sometimes"}, timeout=60
    )
    assert (
        "REFUSED HVDLITE_ALLREDUCE_ALGORITHMS (or HOROVOD_ALLREDUCE_ALGORITHMS) is 'sometimes'; it takes measured"
        in result.stdout
    ), result.stdout + result.stderr


def test_the_suite_measures_into_its_own_directory_not_the_users_cache():
    """Tables measured while the suite loads the machine must not reach ~/.cache/hvdlite, where a later training job
    or benchmark would trust them (tests/conftest.py gives the suite a directory of its own)."""
    suite_cache = os.environ.get("HVDLITE_ALGORITHM_CACHE_DIR", "")
    assert os.path.basename(suite_cache).startswith("hvdlite-suite-algorithms-") and os.path.isdir(suite_cache)
    home_cache = os.path.join(os.path.expanduser("~"), ".cache", "hvdlite")
    assert not os.path.realpath(suite_cache).startswith(os.path.realpath(home_cache))
    result = run_job(
        job_source("algorithm_table"), 2, env={"QUICK_CHECK": "1"}, timeout=120
    )  # the suite's environment, nothing added
    assert_job_ok(result, 2)
    path = infos(result)[0]["allreduce_table_file"]
    assert os.path.dirname(path) == suite_cache and os.path.exists(path), path
