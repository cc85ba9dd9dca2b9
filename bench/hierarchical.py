"""Flat against two-tier (hierarchical) allreduce across hosts, measured and predicted, in one run.

    python bench/hierarchical.py                       # 2 hosts x 2 ranks, links at 1 Gbit/s; writes bench/results/
    python bench/hierarchical.py --rate 250mbit --per-host 4 --rounds 2 --out-dir /tmp/h
    python bench/hierarchical.py --collective allgather   # the same for allgather (hierarchical_allgather.*)

Needs root: the hosts are network-namespace test hosts on a bridge, each with its own sshd (tests/netns_cluster.py),
and every host's link is limited with tc's token bucket in both directions (a real network's link rate; the veth
pairs alone run at memory speed). Each round runs its jobs interleaved: for allreduce the flat ring and flat
recursive halving and doubling (HVDLITE_HIERARCHICAL_ALLREDUCE=0 with HVDLITE_ALLREDUCE_ALGORITHMS=ring or rhd), for
allgather the flat ring; then two-tier (=1) and auto (the cost model's choice; its timeline says which algorithm ran
at each size). Every job times each size REPEATS times after a warm-up; the report gives the median and the worst
over all rounds.

The cost model's predictions come from the core's own code (choice/cost_model.cc through
bench/cost_model_cli.cc) with the link figures the automatic run measured at init; the same figures extrapolate,
on paper, to 32 hosts x 8 and 256 hosts x 8 (flat ring, recursive halving, two-tier, and a pipelined tree for
reference).
Writes hierarchical.json, hierarchical.md and hierarchical.png.
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
ALLREDUCE_MODES = (("ring", "0", "ring"), ("rhd", "0", "rhd"), ("two_tier", "1", None), ("auto", "auto", None))
ALLGATHER_MODES = (("flat", "0", None), ("two_tier", "1", None), ("auto", "auto", None))
EXTRAPOLATE = [(32, 8), (256, 8)]
EXTRAPOLATE_SIZES = [1 << k for k in range(10, 29, 2)]


def build_cli(workdir):
    binary = os.path.join(workdir, "cost_model_cli")
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    core = os.path.join(ROOT, "hvdlite_core")
    subprocess.run(
        [
            compiler,
            "-std=c++17",
            "-O2",
            f"-I{core}/src",
            f"-I{core}/include",
            os.path.join(HERE, "cost_model_cli.cc"),
            os.path.join(core, "src", "choice", "cost_model.cc"),
            "-o",
            binary,
        ],
        check=True,
    )
    return binary


def predict(cli, figures, small, layouts, sizes):
    args = [
        cli,
        str(figures["local_latency_us"] * 1e-6),
        str(figures["local_gbytes_per_s"] * 1e9),
        str(figures["cross_latency_us"] * 1e-6),
        str(figures["cross_gbytes_per_s"] * 1e9),
        str(small),
        ",".join(f"{hosts}x{per_host}" for hosts, per_host in layouts),
        ",".join(map(str, sizes)),
    ]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def two_tier_key(prefix):
    """The prediction for what the core runs: allreduce's two tiers overlapped (pipelined), allgather's in turn."""
    return "allgather_hierarchical" if prefix else "pipelined"


def link_figures(build_info):
    fields = dict(part.split("=", 1) for part in build_info.split(";") if "=" in part)
    return {
        key: float(fields[key])
        for key in ("local_latency_us", "local_gbytes_per_s", "cross_latency_us", "cross_gbytes_per_s")
    }, int(fields.get("SMALL_MESSAGE_BYTES", 65536))


def chosen_algorithms(timeline_path, collective="allreduce"):
    sys.path.insert(0, ROOT)
    from hvdlite.timeline import activities, load

    def kind(name):  # "ALLREDUCE (rhd)", "ALLREDUCE (hierarchical)", "ALLGATHER"
        if "hierarchical" in name:
            return "two_tier"
        return name.split("(", 1)[1].rstrip(")") if "(" in name else "flat"

    chosen = {}
    for tensor, names in activities(load(timeline_path), collective.upper()).items():
        chosen[int(tensor.split(".")[1])] = "/".join(sorted({kind(name) for name in names}))
    return chosen


def run_job(
    cluster, per_host, sizes, repeats, setting, out_path, timeline=None, collective="allreduce", algorithm=None
):
    a, b = cluster.hosts
    env = dict(
        os.environ,
        **{"HVDLITE_HIERARCHICAL_" + collective.upper(): setting},
        PYTHONPATH=os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    )
    if algorithm:
        env["HVDLITE_ALLREDUCE_ALGORITHMS"] = algorithm
    if timeline:
        env["HVDLITE_TIMELINE"] = timeline
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
    try:
        for index in range(2):
            cluster.limit_rate(index, args.rate)
        for round_ in range(args.rounds):
            for mode, setting, algorithm in modes:
                timeline = os.path.join(workdir, "timeline.json") if mode == "auto" and round_ == 0 else None
                result = run_job(
                    cluster,
                    args.per_host,
                    sizes,
                    args.repeats,
                    setting,
                    os.path.join(workdir, f"{mode}.{round_}.json"),
                    timeline,
                    args.collective,
                    algorithm,
                )
                for size, seconds in result["times"].items():
                    times[mode][int(size)] += seconds
                if timeline:
                    build_info = result["build_info"]
                print(
                    f"round {round_ + 1}/{args.rounds} {mode}: "
                    + ", ".join(
                        f"{human(int(s))} {statistics.median(v) * 1e3:.1f} ms" for s, v in result["times"].items()
                    ),
                    flush=True,
                )
        chosen = chosen_algorithms(os.path.join(workdir, "timeline.json"), args.collective)
    finally:
        cluster.stop()
    figures, small = link_figures(build_info)
    cli = build_cli(workdir)
    predicted = {p["bytes"]: p for p in predict(cli, figures, small, [(2, args.per_host)], sizes)}
    prefix = "" if args.collective == "allreduce" else "allgather_"
    two_tier = two_tier_key(prefix)
    extrapolated = predict(cli, figures, small, EXTRAPOLATE, EXTRAPOLATE_SIZES)
    shutil.rmtree(workdir, ignore_errors=True)

    rows = []
    flat_modes = [mode for mode, setting, _ in modes if setting == "0"]
    model_keys = {"flat": prefix + "flat", "ring": "ring", "rhd": "halving"}
    for size in sizes:
        row = {"bytes": size, "chosen": chosen.get(size, "?"), "predicted_two_tier_s": predicted[size][two_tier]}
        for mode in flat_modes:
            row[f"predicted_{mode}_s"] = predicted[size][model_keys[mode]]
        for mode, _, _ in modes:
            row[f"{mode}_median_s"] = statistics.median(times[mode][size])
            row[f"{mode}_worst_s"] = max(times[mode][size])
        rows.append(row)
    report = {
        "collective": args.collective,
        "rate": args.rate,
        "layout": f"2 hosts x {args.per_host}",
        "rounds": args.rounds,
        "repeats": args.repeats,
        "link_figures": figures,
        "rows": rows,
        "extrapolated": extrapolated,
    }
    results_file.save(args.out_dir, name, report, render)
    plot(report, args.out_dir, name, prefix)


def headline(report):
    """One line for the summary of docs/benchmarks.md: the largest size's medians."""
    row = report["rows"][-1]
    flat = "flat_median_s" if "flat_median_s" in row else "ring_median_s"
    return (
        f"{report['layout']} ranks, links at {report['rate']}: two-tier {report['collective']} "
        f"{row[flat] / row['two_tier_median_s']:.2f}x the flat ring at {human(row['bytes'])}; the automatic choice "
        f"ran {row['chosen']}"
    )


def render(report):
    """The tables of a run (bench/results_file.py)."""
    prefix = "" if report["collective"] == "allreduce" else "allgather_"
    rows = report["rows"]
    flat_modes = [mode for mode in ("flat", "ring", "rhd") if f"{mode}_median_s" in rows[0]]
    flat_names = {"flat": "flat ring", "ring": "flat ring", "rhd": "flat rhd"}
    lines = [
        f"Flat against two-tier {report['collective']} across hosts ({report['layout']}, links at {report['rate']}); "
        f"{report['rounds']} interleaved rounds x {report['repeats']} timed {report['collective']}s per size"
        + (" (size: the output, an equal share from every rank)." if prefix else ".")
        + " Link figures measured at init by the automatic run: "
        + ", ".join(f"{k} {v:g}" for k, v in report["link_figures"].items())
        + ".",
        "",
        "| size | "
        + " | ".join(f"{flat_names[m]} median / worst (ms)" for m in flat_modes)
        + " | two-tier median / worst (ms) | ring / two-tier (medians) | auto median (ms) | auto chose | predicted "
        + " / ".join(flat_names[m].split()[-1] for m in flat_modes)
        + " / two-tier (ms) |",
        "|---|" + "---|" * (len(flat_modes) + 5),
    ]
    for row in rows:
        cells = [human(row["bytes"])]
        cells += [
            f"{row[f'{m}_median_s'] * 1e3:.1f} / {row[f'{m}_worst_s'] * 1e3:.1f}" for m in flat_modes + ["two_tier"]
        ]
        cells.append(f"{row[flat_modes[0] + '_median_s'] / row['two_tier_median_s']:.2f}x")
        cells += [f"{row['auto_median_s'] * 1e3:.1f}", row["chosen"]]
        cells.append(" / ".join(f"{row[f'predicted_{m}_s'] * 1e3:.1f}" for m in flat_modes + ["two_tier"]))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Extrapolated with the same link figures (model only):",
        "",
        "| layout | size | flat ring (ms) |"
        + (" flat rhd (ms) |" if not prefix else "")
        + " two-tier (ms) |"
        + (" two-tier, tiers overlapped (ms) | pipelined tree (ms) |" if not prefix else ""),
        "|---|---|---|---|" + ("---|---|---|" if not prefix else ""),
    ]
    for p in report["extrapolated"]:
        ring = p["allgather_flat"] if prefix else p["ring"]
        lines.append(
            f"| {p['hosts']} x {p['per_host']} | {human(p['bytes'])} | {ring * 1e3:.2f} |"
            + (f" {p['halving'] * 1e3:.2f} |" if not prefix else "")
            + f" {p[prefix + 'hierarchical'] * 1e3:.2f} |"
            + (f" {p['pipelined'] * 1e3:.2f} | {p['tree'] * 1e3:.2f} |" if not prefix else "")
        )
    return "\n".join(lines)


def plot(report, out_dir, name="hierarchical", prefix=""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    rows = report["rows"]
    x = [r["bytes"] for r in rows]
    flat_modes = [mode for mode in ("flat", "ring", "rhd") if f"{mode}_median_s" in rows[0]]
    styles = {"flat": "o-", "ring": "o-", "rhd": "d-", "two_tier": "s-", "auto": "^:"}
    for mode in flat_modes + ["two_tier", "auto"]:
        left.plot(x, [r[f"{mode}_median_s"] * 1e3 for r in rows], styles[mode], label=f"{mode} (measured median)")
    for index, mode in enumerate(flat_modes + ["two_tier"]):
        left.plot(
            x,
            [r[f"predicted_{mode}_s"] * 1e3 for r in rows],
            "--",
            color=f"C{index}",
            alpha=0.6,
            label=f"{mode} (model)",
        )
    left.set(
        xscale="log",
        yscale="log",
        xlabel=f"{report['collective']} size (bytes)",
        ylabel="time (ms)",
        title=f"measured, {report['layout']}, links at {report['rate']}",
    )
    left.legend(fontsize=8)
    for (hosts, per_host), color in zip(EXTRAPOLATE, ("C2", "C3")):
        points = [p for p in report["extrapolated"] if p["hosts"] == hosts and p["per_host"] == per_host]
        sizes = [p["bytes"] for p in points]
        ring = [p[prefix + "flat"] if prefix else p["ring"] for p in points]
        right.plot(
            sizes,
            [r / p[two_tier_key(prefix)] for r, p in zip(ring, points)],
            "-",
            color=color,
            label=f"{hosts}x{per_host}: ring / two-tier",
        )
        if not prefix:  # recursive halving and the tree estimate are for allreduce
            right.plot(
                sizes,
                [r / p["halving"] for r, p in zip(ring, points)],
                "--",
                color=color,
                label=f"{hosts}x{per_host}: ring / rhd",
            )
            right.plot(
                sizes,
                [r / p["tree"] for r, p in zip(ring, points)],
                ":",
                color=color,
                label=f"{hosts}x{per_host}: ring / tree",
            )
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set(
        xscale="log",
        yscale="log",
        xlabel=f"{report['collective']} size (bytes)",
        ylabel="speedup over the flat ring",
        title="model, same link figures, extrapolated",
    )
    right.legend(fontsize=8)
    fig.suptitle(results_file.machine_line())
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name + ".png"), dpi=110)


if __name__ == "__main__":
    main()
