"""Flat against two-tier (hierarchical) allreduce and allgather across hosts, in one run.

    python bench/hierarchical.py                       # 2 hosts x 2 ranks, links at 1 Gbit/s; writes bench/results/
    python bench/hierarchical.py --rate 250mbit --per-host 4 --rounds 2 --out-dir /tmp/h
    python bench/hierarchical.py --collective allgather   # the same for allgather (hierarchical_allgather.*)

Needs root: the hosts are network-namespace test hosts on a bridge, each with its own sshd (tests/netns_cluster.py),
and every host's link is limited with tc's token bucket in both directions (a real network's link rate; the veth
pairs alone run at memory speed). Each round runs its jobs interleaved: for allreduce the flat ring and flat
recursive halving and doubling (HVDLITE_HIERARCHICAL_ALLREDUCE=0 with HVDLITE_ALLREDUCE_ALGORITHMS=ring or rhd), for
allgather the flat ring; then two-tier, what hvdlite runs by default wherever every host has several ranks. Every job
times each size REPEATS times after a warm-up; the report gives the median and the worst over all rounds, and each
round's median, so that a ratio can be taken round by round. Writes hierarchical.json and hierarchical.png.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)

import results_file  # noqa: E402
from allreduce import human  # noqa: E402
from netns_cluster import ClusterUnavailable, start_cluster  # noqa: E402

JOB = os.path.join(ROOT, "tests", "jobs", "allreduce_timing.py")
SIZES = [64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
# (mode, HIERARCHICAL_<collective>, ALLREDUCE_ALGORITHMS or None)
ALLREDUCE_MODES = (("ring", "0", "ring"), ("rhd", "0", "rhd"), ("two_tier", "1", None))
ALLGATHER_MODES = (("flat", "0", None), ("two_tier", "1", None))


def run_job(cluster, per_host, sizes, repeats, setting, out_path, collective="allreduce", algorithm=None):
    a, b = cluster.hosts
    env = dict(
        os.environ,
        **{"HVDLITE_HIERARCHICAL_" + collective.upper(): setting},
        PYTHONPATH=os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    )
    if algorithm:
        env["HVDLITE_ALLREDUCE_ALGORITHMS"] = algorithm
    launcher = os.path.join(os.path.dirname(sys.executable), "hvdlite-run")
    result = subprocess.run(
        [
            launcher,
            "-np",
            str(2 * per_host),
            "-H",
            f"{a.address}:{per_host},{b.address}:{per_host}",
            *cluster.ssh_flags(),
            sys.executable,
            JOB,
            out_path,
            ",".join(map(str, sizes)),
            str(repeats),
            collective,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        raise SystemExit(f"the {setting} job failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    with open(out_path) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="1gbit", help="each host's link rate, in tc's units (default 1gbit)")
    parser.add_argument("--per-host", type=int, default=2, help="ranks on each of the 2 hosts (default 2)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three jobs (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="timed allreduces per size per job (default 3)")
    parser.add_argument("--collective", choices=("allreduce", "allgather"), default="allreduce")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    name = "hierarchical" if args.collective == "allreduce" else "hierarchical_allgather"
    sizes = [int(s) for s in args.sizes.split(",")]
    os.makedirs(args.out_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="hvdlite-bench-hier-")
    try:
        cluster = start_cluster(workdir, count=2)
    except ClusterUnavailable as exc:
        raise SystemExit(f"bench/hierarchical.py: cannot create the test hosts: {exc}")
    modes = ALLREDUCE_MODES if args.collective == "allreduce" else ALLGATHER_MODES
    times = {mode: {size: [] for size in sizes} for mode, _, _ in modes}
    by_round = {mode: {size: [] for size in sizes} for mode, _, _ in modes}
    try:
        for index in range(2):
            cluster.limit_rate(index, args.rate)
        for round_ in range(args.rounds):
            for mode, setting, algorithm in modes:
                result = run_job(
                    cluster,
                    args.per_host,
                    sizes,
                    args.repeats,
                    setting,
                    os.path.join(workdir, f"{mode}.{round_}.json"),
                    args.collective,
                    algorithm,
                )
                for size, seconds in result["times"].items():
                    times[mode][int(size)] += seconds
                    by_round[mode][int(size)].append(statistics.median(seconds))
                print(
                    f"round {round_ + 1}/{args.rounds} {mode}: "
                    + ", ".join(
                        f"{human(int(s))} {statistics.median(v) * 1e3:.1f} ms" for s, v in result["times"].items()
                    ),
                    flush=True,
                )
    finally:
        cluster.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for size in sizes:
        row = {"bytes": size}
        for mode, _, _ in modes:
            row[f"{mode}_median_s"] = statistics.median(times[mode][size])
            row[f"{mode}_worst_s"] = max(times[mode][size])
            row[f"{mode}_rounds_s"] = by_round[mode][size]
        rows.append(row)
    report = {
        "collective": args.collective,
        "rate": args.rate,
        "layout": f"2 hosts x {args.per_host}",
        "rounds": args.rounds,
        "repeats": args.repeats,
        "rows": rows,
    }
    results_file.save(args.out_dir, name, report, render)
    plot(report, args.out_dir, name)


def headline(report):
    """One line for the summary of docs/benchmarks.md: the largest size's medians."""
    row = report["rows"][-1]
    flat = "flat_median_s" if "flat_median_s" in row else "ring_median_s"
    return (
        f"{report['layout']} ranks, links at {report['rate']}: two-tier {report['collective']} "
        f"{row[flat] / row['two_tier_median_s']:.2f}x the flat ring's speed at {human(row['bytes'])}"
    )


def render(report):
    """The table of a run (bench/results_file.py)."""
    rows = report["rows"]
    flat_modes = [mode for mode in ("flat", "ring", "rhd") if f"{mode}_median_s" in rows[0]]
    flat_names = {"flat": "flat ring", "ring": "flat ring", "rhd": "flat rhd"}
    lines = [
        f"Flat against two-tier {report['collective']} across hosts ({report['layout']}, links at {report['rate']}); "
        f"{report['rounds']} interleaved rounds x {report['repeats']} timed {report['collective']}s per size"
        + (" (size: the output, an equal share from every rank)." if report["collective"] == "allgather" else "."),
        "",
        "| size | "
        + " | ".join(f"{flat_names[m]} median / worst (ms)" for m in flat_modes)
        + " | two-tier median / worst (ms) | flat ring / two-tier (medians) |",
        "|---|" + "---|" * (len(flat_modes) + 2),
    ]
    for row in rows:
        cells = [human(row["bytes"])]
        cells += [
            f"{row[f'{m}_median_s'] * 1e3:.1f} / {row[f'{m}_worst_s'] * 1e3:.1f}" for m in flat_modes + ["two_tier"]
        ]
        cells.append(f"{row[flat_modes[0] + '_median_s'] / row['two_tier_median_s']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report, out_dir, name="hierarchical"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.6))
    rows = report["rows"]
    x = [r["bytes"] for r in rows]
    flat_modes = [mode for mode in ("flat", "ring", "rhd") if f"{mode}_median_s" in rows[0]]
    styles = {"flat": "o-", "ring": "o-", "rhd": "d-", "two_tier": "s-"}
    for mode in flat_modes + ["two_tier"]:
        ax.plot(x, [r[f"{mode}_median_s"] * 1e3 for r in rows], styles[mode], label=f"{mode} (median)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel=f"{report['collective']} size (bytes)",
        ylabel="time (ms)",
        title=f"{report['layout']}, links at {report['rate']}; {results_file.machine_line()}",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name + ".png"), dpi=110)


if __name__ == "__main__":
    main()
