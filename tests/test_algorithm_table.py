"""The allreduce algorithms of a job: the fixed rules, or on one host the machine's tuned table where
python -m hvdlite.tune wrote one (tuning/table_file.h), obeyed by every rank, overridden by the fixed-rule knobs,
ignored with a warning when damaged; and the settings every rank must share. Across real processes, with numpy
buffers through the core; each run checks its results against a reference at sizes on both sides of every band."""

from __future__ import annotations

import os
import subprocess
import sys

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


# Float32 bytes of the job's counts; the timeline names each allreduce "t.<count>.float32.<op>".
JOB_COUNTS = (1, 3, 1000, 3001, 9000, 70001, 300000, 1 << 20, (4 << 20) + 5)


def algorithms_run(timeline) -> dict:
    from hvdlite.timeline import activities, load

    ran = activities(load(str(timeline)), "ALLREDUCE")
    return {count: ran["t.%d.float32.1" % count] for count in JOB_COUNTS}


@pytest.mark.timeout(120)
def test_without_a_table_the_fixed_rules_run(tmp_path):
    """No tuned table for this machine: recursive doubling below 64 KiB, the ring, single copy from 16 MiB, on every
    rank (the timeline names what each allreduce ran); streaming stores from 64 MiB; build_info names the file a
    tuner would write."""
    timeline = tmp_path / "timeline.json"
    found = run(2, tmp_path, HVDLITE_TIMELINE=str(timeline))
    assert found["allreduce_table"] == "fixed" and found["ALLREDUCE_ALGORITHMS"] == "tuned", found
    assert found["streaming_store_bytes"] == str(64 << 20) and found["streaming_store_bytes_from"] == "default"
    path = found["allreduce_table_file"]
    assert os.path.dirname(path) == str(tmp_path) and not os.path.exists(path), found
    assert "ranks=2" in found["allreduce_table_key"] and ";" not in found["allreduce_table_key"], found
    expected = {
        count: {
            "ALLREDUCE (%s)" % ("rd" if 4 * count < 64 << 10 else "single_copy" if 4 * count >= 16 << 20 else "ring")
        }
        for count in JOB_COUNTS
    }
    assert algorithms_run(timeline) == expected


@pytest.mark.timeout(300)
def test_the_tuner_writes_the_table_that_later_jobs_obey(tmp_path):
    """python -m hvdlite.tune times each algorithm through jobs and writes the machine's table; a job of that size
    reads it and every rank runs it; a job of another size has a file of its own. A table written by hand is obeyed
    algorithm by algorithm, its results checked by the job against the reference."""
    env = dict(os.environ, HVDLITE_ALGORITHM_CACHE_DIR=str(tmp_path))
    tuned = subprocess.run(
        [sys.executable, "-m", "hvdlite.tune", "--rounds", "1", "--sizes", "4096,1048576,16777216"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    found = run(2, tmp_path, QUICK_CHECK="1")
    path = found["allreduce_table_file"]
    header, key, bands, *rest = open(path).read().splitlines()
    assert "\nwrote " + path + "\n" in tuned.stdout, tuned.stdout
    assert header == "hvdlite allreduce table v4" and key == found["allreduce_table_key"], (header, key, found)
    assert found["allreduce_table"] == "tuned" and bands == "allreduce " + found["allreduce_algorithms"], found
    assert rest[0].startswith("streaming_store_bytes ") and rest[1].startswith("measured rd 4096:"), rest
    assert found["streaming_store_bytes"] == rest[0].split()[1] and found["streaming_store_bytes_from"] == "tuned"
    three = run(3, tmp_path, QUICK_CHECK="1")
    assert three["allreduce_table"] == "fixed" and three["allreduce_table_file"] != path, three

    for table, expected in (
        ("ring@0", {1: "rd", 1000: "ring", (4 << 20) + 5: "ring"}),
        ("rd@0,single_copy@16384", {1000: "rd", 9000: "single_copy", 1 << 20: "single_copy"}),
        ("single_copy@0,ring@1000000", {1: "single_copy", 3: "single_copy", 300000: "ring"}),
    ):
        with open(path, "w") as f:
            f.write("%s\n%s\nallreduce %s\n" % (header, key, table))
        timeline = tmp_path / "timeline.json"
        forced = run(2, tmp_path, HVDLITE_TIMELINE=str(timeline))
        assert forced["allreduce_table"] == "tuned" and forced["allreduce_algorithms"] == table, forced
        assert forced["streaming_store_bytes_from"] == "default", forced  # the file does not say
        ran = algorithms_run(timeline)
        for count, algorithm in expected.items():
            assert ran[count] == {"ALLREDUCE (%s)" % algorithm}, (table, count, ran)


def test_the_tuner_keeps_the_fixed_rules_unless_another_is_clearly_faster_in_most_rounds():
    from hvdlite.tune import choose

    def figures(rd, ring, copy, plain, streamed):
        return {
            "rd": {4096: rd},
            "ring": {4096: ring, 16 << 20: plain},
            "single_copy": {16 << 20: copy},
            "ring_streaming": {16 << 20: streamed},
        }

    sizes = [4096, 16 << 20]
    # Single copy, the fixed rule at 16 MiB, loses clearly to the ring in two rounds of three; the ring at 4 KiB wins
    # by 5% only (a tie: recursive doubling stays); streaming stores win in two of three.
    rounds = [figures(1.0, 0.95, 2.0, 1.0, 0.9), figures(1.0, 0.95, 2.0, 1.0, 1.1), figures(1.0, 0.95, 0.5, 1.0, 0.8)]
    assert choose(rounds, sizes) == ([(0, "rd"), (int((4096 * (16 << 20)) ** 0.5), "ring")], 16 << 20)
    assert choose(rounds[2:], sizes) == ([(0, "rd"), (int((4096 * (16 << 20)) ** 0.5), "single_copy")], 16 << 20)
    # The ring clearly faster at 4 KiB in every round; streaming stores slower at the largest probe: never.
    rounds = [figures(1.0, 0.5, 1.0, 1.0, 1.2)] * 3
    assert choose(rounds, sizes) == ([(0, "ring"), (int((4096 * (16 << 20)) ** 0.5), "single_copy")], 0)
    # Not measured at all: the file leaves the threshold to the default.
    assert choose([{"rd": {4096: 1.0}, "ring": {4096: 1.0}}], [4096]) == ([(0, "rd")], None)


@pytest.mark.timeout(180)
def test_a_damaged_table_is_ignored_with_a_warning_and_knobs_override_a_good_one(tmp_path):
    found = run(2, tmp_path, QUICK_CHECK="1")
    path, key = found["allreduce_table_file"], found["allreduce_table_key"]
    good = "hvdlite allreduce table v4\n%s\nallreduce rd@0,ring@1000\nstreaming_store_bytes 1234567\n" % key
    for damage, warned in (
        ("", True),
        ("hvdlite allreduce table v3\n%s\nrd@0,ring@1000\n" % key, False),  # an earlier version's measurements
        ("something else\n", True),
        (good.replace("@0", "@5", 1), True),
        (good.replace("allreduce rd@0", "rd@0"), True),
        (good + "by hand\n", True),
        (good.replace("1234567", "-1"), True),
        (good.replace("1234567", "12x"), True),
    ):
        with open(path, "w") as f:
            f.write(damage)
        result = run_job(
            job_source("algorithm_table"),
            2,
            env={"HVDLITE_ALGORITHM_CACHE_DIR": str(tmp_path), "QUICK_CHECK": "1"},
            timeout=120,
        )
        assert_job_ok(result, 2)
        assert infos(result)[0]["allreduce_table"] == "fixed", damage
        warning = "ignoring the tuned table %s" % path
        assert (warning in result.stdout + result.stderr) == warned, (damage, result.stderr[-2000:])
    with open(path, "w") as f:
        f.write(good)
    assert run(2, tmp_path, QUICK_CHECK="1")["streaming_store_bytes"] == "1234567"
    # The fixed-rule knobs keep a user's setting; ALLREDUCE_ALGORITHMS=fixed asks for the fixed rules outright.
    for env in (
        {"HVDLITE_SINGLE_COPY_ALLREDUCE": "1"},
        {"HVDLITE_SINGLE_COPY_ALLREDUCE_BYTES": str(1 << 20)},
        {"HOROVOD_SMALL_MESSAGE_BYTES": "1024"},
        {"HVDLITE_ALLREDUCE_ALGORITHMS": "fixed"},
    ):
        fixed = run(2, tmp_path, QUICK_CHECK="1", **env)
        assert fixed["allreduce_table"] == "fixed" and fixed["ALLREDUCE_ALGORITHMS"] == "fixed", (env, fixed)
    # STREAMING_STORE_BYTES given: obeyed, whatever the table says.
    given = run(2, tmp_path, QUICK_CHECK="1", HVDLITE_STREAMING_STORE_BYTES="12345")
    assert given["streaming_store_bytes_from"] == "knob" and given["streaming_store_bytes"] == "12345", given


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


@pytest.mark.parametrize(
    "knob,value,differs",
    [
        ("ALLREDUCE_ALGORITHMS", "fixed", "tuned on rank 0, fixed on rank 1"),
        ("SINGLE_COPY_ALLREDUCE_BYTES", "0", "0 on rank 1, 16777216 on rank 0"),
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
        "REFUSED HVDLITE_ALLREDUCE_ALGORITHMS (or HOROVOD_ALLREDUCE_ALGORITHMS) is 'sometimes'; it takes tuned"
        in result.stdout
    ), result.stdout + result.stderr


def test_the_suite_keeps_its_tables_in_its_own_directory_not_the_users_cache():
    """Tables the suite writes (by hand or by the tuner, while it loads the machine) must not reach ~/.cache/hvdlite,
    where a later training job or benchmark would trust them (tests/conftest.py gives the suite a directory of its
    own)."""
    suite_cache = os.environ.get("HVDLITE_ALGORITHM_CACHE_DIR", "")
    assert os.path.basename(suite_cache).startswith("hvdlite-suite-algorithms-") and os.path.isdir(suite_cache)
    home_cache = os.path.join(os.path.expanduser("~"), ".cache", "hvdlite")
    assert not os.path.realpath(suite_cache).startswith(os.path.realpath(home_cache))
    result = run_job(
        job_source("algorithm_table"), 2, env={"QUICK_CHECK": "1"}, timeout=120
    )  # the suite's environment, nothing added
    assert_job_ok(result, 2)
    path = infos(result)[0]["allreduce_table_file"]
    assert os.path.dirname(path) == suite_cache, path
