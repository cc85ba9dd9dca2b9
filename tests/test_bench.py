"""The benchmark scripts, each run for real on a small configuration so that none can rot: they write their table,
JSON and plot. Those runs carry the ``bench`` mark: `make bench` runs them before the benchmarks, and the suite that
CI runs leaves them out (about two minutes on 2 cores that test the measuring, not the product). The checks of the
scripts' own logic below run everywhere."""

import argparse
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(300)
@pytest.mark.bench
def test_allreduce_bench_writes_table_json_and_plot(tmp_path):
    sizes = [8, 65536]
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "allreduce.py"),
            "--peers",
            "hvdlite,hvdlite-mpi,mpi",
            "--rounds",
            "2",
            "--sizes",
            ",".join(map(str, sizes)),
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads((tmp_path / "allreduce.json").read_text())
    assert record["benchmark"] == "allreduce" and record["command"].startswith("python bench/allreduce.py --peers")
    assert record["machine"] and len(record["date"]) == 10
    runs = record["data"]["runs"]
    assert set(runs) == {"hvdlite", "hvdlite-mpi", "mpi"}
    for run in runs.values():
        assert [r["bytes"] for r in run["results"]] == sizes and run["ranks"] == 2
        assert all(0 < r["median_s"] <= r["worst_s"] < 1 and len(r["rounds_s"]) == 2 for r in run["results"])
        assert len(run["pingpong_us"]) == 2 and all(0 < us < 1e5 for pair in run["pingpong_us"] for us in pair)
        # a C compiler is part of the set-up contract, so the placement probe always runs here
        assert len(run["cacheline_ns"]) == 2 and all(0 < ns < 1e5 for pair in run["cacheline_ns"] for ns in pair)
    table = (tmp_path / "allreduce.md").read_text()
    assert table.startswith("`python bench/allreduce.py") and "2 round(s)" in table
    assert "mpi time / hvdlite time, median (worst)" in table and "hvdlite-mpi time / hvdlite time" in table
    assert "| 8 B |" in table and "| 64 KB |" in table
    assert "Machine state: a 2 MB ping-pong" in table and "Where the host ran the two vCPUs" in table
    import matplotlib.image

    png = tmp_path / "allreduce.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(str(png)).shape[:2]
    assert width > 1000 and height > 400, (width, height)


@pytest.mark.timeout(300)
@pytest.mark.bench
def test_hierarchical_bench_writes_table_json_and_plot(tmp_path):
    """bench/hierarchical.py for real on two network-namespace hosts, one size, one round (a smoke run)."""
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "hierarchical.py"),
            "--sizes",
            "1048576",
            "--rounds",
            "1",
            "--repeats",
            "1",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "hierarchical.json").read_text())["data"]
    (row,) = report["rows"]
    assert row["bytes"] == 1048576, row
    for mode in ("ring", "rhd", "two_tier"):  # the flat ring, flat recursive halving, two tiers
        assert 0 < row[mode + "_median_s"] <= row[mode + "_worst_s"] < 10 and len(row[mode + "_rounds_s"]) == 1, row
    assert "| 1 MB |" in (tmp_path / "hierarchical.md").read_text()
    assert (tmp_path / "hierarchical.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(200)
@pytest.mark.bench
def test_slow_links_bench_writes_table_json_and_plot(tmp_path):
    """bench/slow_links.py for real on two network-namespace hosts with 1 Gbit/s links, hvdlite's PowerSGD, DDP's
    PowerSGD hook and the Keras net with PowerSGD and its trial for a few steps (a smoke run): all train, the
    link's counters saw their traffic, and the report, its JSON and the plot are written."""
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "slow_links.py"),
            "--methods",
            "powersgd,ddp-powersgd,keras-powersgd-8-trial",
            "--steps",
            "12",
            "--eval-every",
            "4",
            "--rates",
            "1gbit",
            "--target",
            "0.05",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "slow_links.json").read_text())["data"]["results"]["1gbit"]["0"]
    assert set(rows) == {"powersgd", "ddp-powersgd", "keras-powersgd-8-trial"}
    for row in rows.values():
        assert [point[0] for point in row["curve"]] == [4, 8, 12]
        assert row["seconds_to_target"] is not None and 0 < row["final_accuracy"] <= 1
        # Ten uncompressed steps of 4.3 MB each way, then two compressed ones: megabytes per step on the link.
        assert 1e6 < row["link_bytes_per_step"] < 20e6, row
    assert "| powersgd |" in (tmp_path / "slow_links.md").read_text()
    assert (tmp_path / "slow_links.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.bench
def test_train_bench_writes_table_json_and_plot(tmp_path):
    """bench/train.py as a smoke run (small model, one round): single process, two independent ones (the
    ceiling), the two in lockstep, DDP, hvdlite, hvdlite with the autotuner and hvdlite with settings of its own
    (--env-row) all train.
    The flags' named rows (--static-algorithms, ...) are rows with settings too: the next test checks theirs."""
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "train.py"),
            "--model",
            "resnet_small",
            "--image-size",
            "32",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--rounds",
            "1",
            "--autotune",
            "--env-row",
            "HVDLITE_FUSION_THRESHOLD=1048576,HVDLITE_CYCLE_TIME=2",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads((tmp_path / "train.json").read_text())
    report = record["data"]
    assert {r["kind"] for r in report["rounds"]} == {
        "single",
        "independent",
        "lockstep",
        "ddp",
        "hvdlite",
        "hvdlite-autotune",
        "hvdlite-env1",
    }
    # An --env-row row ran with its settings, the default row without them.
    knobs = {r["kind"]: r["knobs"] for r in report["rounds"] if r["kind"].startswith("hvdlite")}
    assert knobs["hvdlite-env1"]["FUSION_THRESHOLD"] == "1048576" and knobs["hvdlite-env1"]["CYCLE_TIME"] == "2", (
        knobs
    )
    assert knobs["hvdlite"]["FUSION_THRESHOLD"] != "1048576", knobs
    # The autotune row's search finished in its warm-up steps, so its timed steps ran on the chosen settings.
    assert [r["tuned"]["autotune"] for r in report["rounds"] if r["kind"] == "hvdlite-autotune"] == ["done"]
    assert all(r["img_per_s"] > 0 and "load_average" in r for r in report["rounds"])
    assert record["machine"] and record["command"].startswith("python bench/train.py")
    table = (tmp_path / "train.md").read_text()
    assert "| hvdlite, 2 ranks |" in table and "load average" in table and "(the ceiling)" in table
    assert "waiting for each other after every step" in table and "hvdlite / lockstep by round: " in table
    assert "| hvdlite, 2 ranks, HVDLITE_FUSION_THRESHOLD=1048576, HVDLITE_CYCLE_TIME=2 |" in table
    assert (tmp_path / "train.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_bench_named_rows_are_rows_with_settings():
    """Each flag's row runs hvdlite with its variable set, through the same path as an --env-row row (which the
    smoke run above takes end to end), and is labelled with it."""
    train = _bench_module("train")
    expected = {
        "hvdlite-during-backward": {"HVDLITE_REDUCE_DURING_BACKWARD": "1"},
        "hvdlite-no-streaming": {"HVDLITE_STREAMING_STORE_BYTES": "0"},
        "hvdlite-fixed": {"HVDLITE_ALLREDUCE_ALGORITHMS": "fixed"},
        "hvdlite-fusion8": {"HVDLITE_FUSION_THRESHOLD": str(8 << 20)},
        "hvdlite": {},
    }
    for kind, settings in expected.items():
        assert train.row_settings(kind) == settings, kind
    assert train.label("hvdlite-no-streaming") == "hvdlite, 2 ranks, HVDLITE_STREAMING_STORE_BYTES=0"
    assert train.label("hvdlite-fixed", short=True) == "hvdlite, fixed rules"


def test_slow_links_report_says_what_each_trial_decided_on():
    """A trial decided on its compressed steps, and one decided before any (its uncompressed steps barely waited
    for the exchange), each in one line of the report."""
    slow_links = _bench_module("slow_links")
    full = {
        "decision": False,
        "plain_seconds": 0.0519,
        "compressed_seconds": 0.0566,
        "waited_seconds": 0.014,
        "compressed_steps": 2,
        "trial_from": 10,
    }
    assert slow_links.trial_summary(full) == (
        "the trial's uncompressed steps took 51.9 ms (median), 14.0 ms of it waiting for the exchange (each step's "
        "least wait over the ranks); 2 compressed steps took 56.6 ms (median); not compressing."
    )
    bound = dict(full, compressed_seconds=None, compressed_steps=0, waited_seconds=0.002)
    assert slow_links.trial_summary(bound).endswith(
        "2.0 ms of it waiting for the exchange (each step's least wait over the ranks); not compressing, decided "
        "before any compressed step."
    )


def test_slow_links_report_sums_up_seeds_against_the_same_seeds_sync_run():
    """With several seeds, each method's time to target and final accuracy are set against the synchronous run of
    the same seed, each framework against its own, and a method that missed the target in one seed has no
    median."""
    slow_links = _bench_module("slow_links")

    def row(seconds, accuracy):
        return {
            "seconds_to_target": seconds,
            "final_accuracy": accuracy,
            "median_step_s": 0.1,
            "link_bytes_per_step": 1e6,
            "curve": [],
        }

    by_seed = {
        0: {
            "sync": row(30.0, 0.94),
            "powersgd": row(10.0, 0.935),
            "topk": row(20.0, 0.90),
            "keras-sync": row(60.0, 0.92),
            "keras-powersgd-8": row(12.0, 0.93),
        },
        1: {
            "sync": row(24.0, 0.93),
            "powersgd": row(12.0, 0.932),
            "topk": row(None, 0.80),
            "keras-sync": row(50.0, 0.91),
            "keras-powersgd-8": row(25.0, 0.90),
        },
        2: {
            "sync": row(27.0, 0.95),
            "powersgd": row(9.0, 0.94),
            "topk": row(13.5, 0.93),
            "keras-sync": row(40.0, 0.90),
            "keras-powersgd-8": row(10.0, 0.90),
        },
    }
    args = type("Args", (), {"per_host": 2, "steps": 320, "batch": 32, "target": 0.85})()
    report = slow_links.report_table({"100mbit": by_seed}, args)
    assert "Link 100mbit, seed 1:" in report
    assert "| powersgd | 3.00x, 2.00x, 3.00x | 3.00x | -0.5, +0.2, -1.0 | -0.43 |" in report
    assert "| topk | 1.50x, -, 2.00x | - | -4.0, -13.0, -2.0 | -6.33 |" in report
    assert "| keras-powersgd-8 | 5.00x, 2.00x, 4.00x | 4.00x | +1.0, -1.0, +0.0 | +0.00 |" in report
    assert "| sync |" not in report.split("3 seeds")[1]
    single = slow_links.report_table({"100mbit": {0: by_seed[0]}}, args)
    assert "Link 100mbit:" in single and "seeds" not in single


@pytest.mark.timeout(200)
@pytest.mark.bench
def test_step_timeline_draws_both_ranks(tmp_path):
    """bench/step_timeline.py as a smoke run: both ranks' timelines and phases become a table, JSON and a PNG."""
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "step_timeline.py"),
            "--model",
            "resnet_small",
            "--image-size",
            "32",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "step_timeline.json").read_text())["data"]
    assert sorted((s["step"], s["rank"]) for s in report["steps"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # Every step reduced its gradients, so each rank saw some execution time.
    assert all(s["allreduce_executing_ms"] > 0 and s["backward"] > 0 for s in report["steps"]), report
    assert (tmp_path / "step_timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["step_timeline.json", "step_timeline.md", "step_timeline.png"]


def _bench_module(name):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_training_reports_take_each_figure_within_its_round_and_give_median_and_worst():
    """Three rounds in which the machine slowed every configuration in round 2: the figures within a round stay
    what they were, and the report gives each one's median and worst round, not the best."""
    rounds_module = _bench_module("rounds")
    img = {  # single, pair (the ceiling), lockstep, mwms, hvdlite, per round
        1: (100.0, 190.0, 200.0, 100.0, 170.0),
        2: (50.0, 95.0, 100.0, 50.0, 80.0),
        3: (100.0, 190.0, 160.0, 96.0, 176.0),
    }
    rounds = [
        {"round": r, "kind": kind, "img_per_s": value, "seconds": 1.0, "fit_seconds": 1.5}
        for r, values in img.items()
        for kind, value in zip(("single", "pair", "lockstep", "mwms", "hvdlite"), values)
    ]
    summary = rounds_module.summarize(rounds, ("single", "pair", "mwms", "hvdlite"), ceiling="pair")
    assert summary["hvdlite"]["efficiency"]["rounds"] == [0.85, 0.8, 0.88]
    assert summary["hvdlite"]["efficiency"]["median"] == 0.85 and summary["hvdlite"]["efficiency"]["worst"] == 0.8
    assert summary["hvdlite"]["img_per_s"] == {
        "median": 170.0,
        "worst": 80.0,
        "best": 176.0,
        "rounds": [170.0, 80.0, 176.0],
    }
    assert "of_ceiling" not in summary["pair"] and "efficiency" not in summary["single"]
    assert rounds_module.ratio_by_round(rounds, "hvdlite", "mwms")["rounds"] == [1.7, 1.6, 1.8333333333333333]
    assert rounds_module.median([3, 1, 2, 4]) == 2.5

    keras_train = _bench_module("keras_train")
    overhead = {"rounds": 3, "steps": 100, "plain_us_per_step": 300.0, "hvdlite_us_per_step": 480.0}
    overhead["overhead_us_per_step"] = 180.0
    args = argparse.Namespace(steps=200, warmup=10, rounds=3, batch=32, out_dir="/tmp")
    data = keras_train.figures(rounds, overhead, args)
    table, versus_mwms, versus_lockstep = (
        keras_train.render(data),
        data["hvdlite_over_mwms"],
        data["hvdlite_over_lockstep"],
    )
    assert versus_mwms["median"] == 1.7 and versus_mwms["worst"] == 1.6
    assert versus_lockstep["rounds"] == [0.85, 0.8, 1.1]
    assert "hvdlite / the lockstep processes img/s: median 0.85x, worst 0.80x" in table
    assert "| hvdlite DistributedOptimizer, 2 ranks | 170.0 (80.0 - 176.0) | 85.0% (80.0%) | 0.89x (0.84x) |" in table
    assert "round 2: hvdlite efficiency 80.0%, lockstep 100.0%, MWMS 50.0%, hvdlite / MWMS 1.60x" in table
    assert "median 1.70x, worst 1.60x" in table
    assert f"took {', '.join(['0.50'] * len(rounds))} s in the runs above" in table


@pytest.mark.timeout(120)
def test_gpu_collectives_bench_runs_its_cases_and_plots(tmp_path):
    """The GPU benchmark's own logic, without a GPU: its CPU dry run takes the same steps (np=1 in process, np=2
    under hvdlite's launcher, torch.distributed beside hvdlite) and writes the table's rows and the plot."""
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "gpu_collectives.py"),
            "--dry-run-on-cpu",
            "--rounds",
            "1",
            "--out-dir",
            str(tmp_path),
        ],
        check=True,
        timeout=100,
    )
    with open(tmp_path / "gpu_collectives.json", encoding="utf-8") as f:
        result = json.load(f)
    cases = [(r["case"], r["bytes"]) for r in result["rows"]]
    assert cases == [
        ("np1-nccl-allreduce", 1 << 20),
        ("np1-nccl-allreduce", 64 << 20),
        ("np1-nccl-allreduce", 1 << 30),
        ("np1-nccl-4-byte-latency", 4),
        ("np2-shared-gpu-allreduce", 1 << 20),
        ("np2-shared-gpu-allreduce", 64 << 20),
    ], cases
    for r in result["rows"]:
        assert (
            r["hvdlite_us"] > 0 and r["torch_us"] > 0 and r["ratio"] == pytest.approx(r["torch_us"] / r["hvdlite_us"])
        )
    assert (tmp_path / "gpu_collectives.png").stat().st_size > 10_000


@pytest.mark.timeout(600)
@pytest.mark.bench
def test_fixed_costs_bench_writes_table_json_and_plot(tmp_path):
    """bench/fixed_costs.py for real, every part on small counts, one round."""
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "fixed_costs.py"),
            "--rounds",
            "1",
            "--ks",
            "16,128",
            "--optimizer-ks",
            "64",
            "--gpt-layers",
            "2",
            "--keras-variables",
            "4",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "fixed_costs.json").read_text())["data"]["summary"]
    assert [row["bytes"] for row in summary["latency"]] == [8, 1024]
    assert all(0 < row[p]["median"] < 1 for row in summary["latency"] for p in ("hvdlite", "hvdlite-out", "mpi"))
    assert all("mpi_over_hvdlite_out" in row for row in summary["latency"])
    assert [row["k"] for row in summary["per_tensor"]] == [16, 128]
    curve = ("hvdlite-async", "hvdlite-grouped", "gloo-fused", "touch-floor", "exchange-floor")
    assert all(p in row for row in summary["per_tensor"] for p in curve)
    assert summary["linearity"]["touch-floor"]["by_k"]["128"]["median"] == 1.0
    assert summary["linearity"]["exchange-floor"]["by_k"]["128"]["median"] == 1.0
    assert [row["k"] for row in summary["optimizer"]] == [64] and "ddp_over_hvdlite" in summary["optimizer"][0]
    gpt = summary["transformer"]
    assert gpt["tensors"] == 2 * 16 + 5 and "ddp_over_hvdlite" in gpt
    assert all(0 < gpt[p]["step"]["median"] < 10 for p in ("opt-hvdlite", "opt-ddp"))
    assert gpt["opt-hvdlite"]["barrier_added"]["median"] < 1 and "barrier_added" not in gpt["opt-ddp"]
    assert [row["variables"] for row in summary["keras"]] == [4]
    assert 0 < summary["keras"][0]["local"]["median"] < summary["keras"][0]["distributed"]["median"] < 1
    assert summary["keras"][0]["barrier_added"]["median"] < 1
    assert 0 < summary["keras"][0]["tape_local"]["median"] < summary["keras"][0]["tape_distributed"]["median"] < 1
    assert summary["keras"][0]["tape_barrier_added"]["median"] < 1
    table = (tmp_path / "fixed_costs.md").read_text()
    assert (
        table.startswith("`python bench/fixed_costs.py")
        and "| 8 B |" in table
        and "| 128 |" in table
        and "| 64 |" in table
    )
    assert "37 parameter tensors" in table and "| Keras fit, variables |" in table and "| 4 |" in table
    assert "added by a bare shared-memory barrier in the step (ms) |" in table
    assert "| custom loop, variables |" in table and "added by DistributedGradientTape (ms) |" in table
    assert "| touch floor per tensor / at K=128 | exchange floor per tensor / at K=128 |" in table
    assert (tmp_path / "fixed_costs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fixed_costs_report_pairs_rounds_and_leaves_out_parts_not_run():
    """Ratios are taken within a round; linearity is each K's cost per tensor over the first K of at least 128's,
    within a round; a part whose peers did not run has no table."""
    fixed_costs = _bench_module("fixed_costs")
    rounds = [
        {
            "hvdlite-async": [
                {"k": 64, "seconds": 64e-6},
                {"k": 128, "seconds": 256e-6},
                {"k": 512, "seconds": 1536e-6},
            ],
            "hvdlite-grouped": [
                {"k": 64, "seconds": 32e-6},
                {"k": 128, "seconds": 64e-6},
                {"k": 512, "seconds": 1024e-6},
            ],
            "gloo-fused": [
                {"k": 64, "seconds": 128e-6},
                {"k": 128, "seconds": 128e-6},
                {"k": 512, "seconds": 512e-6},
            ],
            "opt-hvdlite": [{"k": 64, "local": 1.0, "distributed": 2.0}],
            "opt-ddp": [{"k": 64, "local": 1.0, "distributed": 3.0}],
        },
        {
            "hvdlite-async": [
                {"k": 64, "seconds": 128e-6},
                {"k": 128, "seconds": 256e-6},
                {"k": 512, "seconds": 1024e-6},
            ],
            "gloo-fused": [{"k": 64, "seconds": 64e-6}, {"k": 128, "seconds": 512e-6}, {"k": 512, "seconds": 512e-6}],
            "opt-hvdlite": [{"k": 64, "local": 1.0, "distributed": 4.0}],
            "opt-ddp": [{"k": 64, "local": 1.0, "distributed": 2.0}],
        },
    ]
    summary = fixed_costs.summarize(rounds, [64, 128, 512])
    assert summary["latency"] == []
    row = {r["k"]: r for r in summary["per_tensor"]}
    assert row[64]["gloo_fused_over_async"]["rounds"] == [2.0, 0.5]
    assert row[64]["gloo_fused_over_grouped"]["rounds"] == [4.0] and row[512]["gloo_fused_over_grouped"][
        "rounds"
    ] == [0.5]
    assert row[128]["hvdlite-async"]["median"] == 2e-6 and row[128]["hvdlite-async"]["worst"] == 2e-6
    linear = summary["linearity"]["hvdlite-async"]
    assert linear["base_k"] == 128 and linear["by_k"]["512"]["rounds"] == [1.5, 1.0]
    optimizer = summary["optimizer"][0]
    assert optimizer["ddp_over_hvdlite"]["rounds"] == [1.5, 0.5] and optimizer["ddp_over_hvdlite"]["worst"] == 0.5
    assert optimizer["opt-hvdlite"]["added_per_parameter"]["rounds"] == [1 / 64, 3 / 64]
    lines = fixed_costs.report_lines(summary)
    assert not any(line.startswith("| allreduce |") for line in lines)
    # K=512: 2.5 us a tensor in the median of 3 and 2, the gloo ratios' medians of 1/3 and 1/2 and of 1/2 (grouped
    # ran in the first round only), linearity 1.25
    assert "| 512 | 2.50 (3.00) | 2.00 (2.00) | 1.00 (1.00) | 0.42x (0.33x) | 0.50x (0.50x) | 1.25 (1.50) |" in lines
    assert any(line.startswith("| 64 | 3000.00 (4000.00) | 2500.00 (3000.00) | 1.00x (0.50x) |") for line in lines)


@pytest.mark.timeout(600)
@pytest.mark.bench
def test_torch_features_bench_writes_table_and_json(tmp_path):
    """bench/torch_features.py for real on a one-block transformer, one round: compiled against eager, and the
    optimizer state sharded against unsharded, for hvdlite and DDP."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "torch_features.py"), "--rounds", "1", "--layers", "1"]
        + ["--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "torch_features.json").read_text())["data"]["summary"]
    assert set(summary["compile-hvdlite"]) == {"eager", "compiled"}
    for peer in ("zero-hvdlite", "zero-ddp"):
        whole, share = summary[peer]["unsharded"]["state_bytes"], summary[peer]["sharded"]["state_bytes"]
        assert 0 < share < whole, (peer, share, whole)
    assert set(summary["ratios"]) == {
        "eager_over_compiled",
        "unsharded_over_sharded",
        "ddp_zero_over_sharded",
        "ddp_over_unsharded",
    }
    table = (tmp_path / "torch_features.md").read_text()
    assert "torch.compile (inductor)" in table and "ZeroRedundancyOptimizer" in table


def test_allreduce_bench_variants_name_hvdlite_settings():
    """--variant NAME:VAR=VALUE adds hvdlite with other settings to the same run; anything else is refused."""
    allreduce = _bench_module("allreduce")
    assert allreduce.parse_variant("no-huge-pages:HVDLITE_HUGE_PAGE_BYTES=0") == (
        "no-huge-pages",
        {"HVDLITE_HUGE_PAGE_BYTES": "0"},
    )
    assert allreduce.parse_variant("x:HVDLITE_A=1,HOROVOD_B=a=b") == ("x", {"HVDLITE_A": "1", "HOROVOD_B": "a=b"})
    for bad in ("no-settings", ":HVDLITE_A=1", "x:PATH=/tmp", "x:"):
        with pytest.raises(argparse.ArgumentTypeError):
            allreduce.parse_variant(bad)
