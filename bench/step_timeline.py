"""One training step seen from both ranks: where its time goes.

    python bench/step_timeline.py [--model resnet50] [--image-size 64] [--warmup 5] [--steps 3]

Runs bench/train.py's model on 2 hvdlite ranks (one intra-op thread each, as the training benchmark), warms up,
then records --steps steps with every rank writing its own timeline (``hvd.start_timeline`` with ``{rank}`` in
the path) and the Python side marking forward, backward and the optimizer step. It writes
``step_timeline.png`` (both ranks, one lane each for the Python phases, the gradients' negotiation and their
execution), ``step_timeline.json`` (each step's phases and hvdlite's busy time per rank) and prints a table.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import results_file  # noqa: E402
from train import build  # noqa: E402  (puts examples/ on sys.path too)


def worker(args):
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    model, data, target = build(args.model, args.image_size)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step(marks=None):
        t0 = time.monotonic()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        t1 = time.monotonic()
        loss.backward()
        t2 = time.monotonic()
        optimizer.step()
        t3 = time.monotonic()
        if marks is not None:
            marks.append({"forward": [t0, t1], "backward": [t1, t2], "optimizer step": [t2, t3]})

    for _ in range(args.warmup):
        step()
    hvd.barrier()
    path = os.path.join(args.out_dir, f".timeline.{rank}.json")
    hvd.start_timeline(os.path.join(args.out_dir, ".timeline.{rank}.json"))
    origin = time.monotonic()  # the timeline's clock starts here (steady_clock is CLOCK_MONOTONIC)
    marks = []
    for _ in range(args.steps):
        step(marks)
    hvd.stop_timeline()
    with open(os.path.join(args.out_dir, f".marks.{rank}.json"), "w") as f:
        json.dump({"origin": origin, "marks": marks, "timeline": path}, f)


def spans(path):
    """(tensor, activity, start s, end s) of every span in a timeline, in seconds from its origin."""
    from hvdlite.timeline import load
    from hvdlite.timeline import spans as timeline_spans

    return [(tensor, name, began / 1e6, ended / 1e6) for tensor, name, began, ended in timeline_spans(load(path))]


def union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.worker:
        worker(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [
        sys.executable,
        "-m",
        "hvdlite.runner.local",
        "-np",
        "2",
        "--",
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--model",
        args.model,
        "--image-size",
        str(args.image_size),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--out-dir",
        args.out_dir,
    ]
    subprocess.run(cmd, env=env, check=True, timeout=1800)

    ranks = {}
    for rank in (0, 1):
        with open(os.path.join(args.out_dir, f".marks.{rank}.json")) as f:
            info = json.load(f)
        ranks[rank] = {"origin": info["origin"], "marks": info["marks"], "spans": spans(info["timeline"])}
    base = min(r["origin"] for r in ranks.values())
    data = {"model": args.model, "image_size": args.image_size, "steps": []}
    for i in range(args.steps):
        for rank, r in ranks.items():
            m = r["marks"][i]
            begin, end = m["forward"][0] - r["origin"], m["optimizer step"][1] - r["origin"]
            clipped = [(n, max(a, begin), min(b, end)) for _, n, a, b in r["spans"] if b > begin and a < end]
            executing = union_length([(a, b) for n, a, b in clipped if not n.startswith("NEGOTIATE")])
            negotiating = union_length([(a, b) for n, a, b in clipped if n.startswith("NEGOTIATE")])
            data["steps"].append(
                {
                    "step": i,
                    "rank": rank,
                    **{k: 1000 * (v[1] - v[0]) for k, v in m.items()},
                    "allreduce_executing_ms": 1000 * executing,
                    "negotiating_ms": 1000 * negotiating,
                }
            )
    results_file.save(args.out_dir, "step_timeline", data, render)
    plot(ranks, base, args)
    for rank in (0, 1):
        os.remove(os.path.join(args.out_dir, f".marks.{rank}.json"))
        os.remove(os.path.join(args.out_dir, f".timeline.{rank}.json"))


def headline(data):
    """One line for the summary of docs/benchmarks.md."""
    steps = data["steps"][1:] if len(data["steps"]) > 2 else data["steps"]  # the first step warms up
    total = [row["forward"] + row["backward"] + row["optimizer step"] for row in steps]
    executing = [row["allreduce_executing_ms"] for row in steps]
    return (
        f"{data['model']}: gradients reduce in {min(executing):.0f}-{max(executing):.0f} ms of a "
        f"{min(total):.0f}-{max(total):.0f} ms step"
    )


def render(data):
    """The table of a run (bench/results_file.py)."""
    lines = [
        f"{data['model']}, {data['image_size']}x{data['image_size']}, batch 8 per rank, 2 ranks",
        "",
        "| step | rank | forward ms | backward ms | optimizer step ms | allreduce executing ms | negotiating "
        "(any gradient) ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in data["steps"]:
        lines.append(
            f"| {row['step']} | {row['rank']} | {row['forward']:.1f} | {row['backward']:.1f} | "
            f"{row['optimizer step']:.1f} | {row['allreduce_executing_ms']:.1f} | {row['negotiating_ms']:.1f} |"
        )
    return "\n".join(lines)


def plot(ranks, base, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"forward": "C0", "backward": "C1", "optimizer step": "C2"}
    fig, ax = plt.subplots(figsize=(11, 3.8))
    labels = []
    y = 0
    for rank in (1, 0):
        r = ranks[rank]
        shift = r["origin"] - base
        negotiate = [(a + shift, b - a) for _, n, a, b in r["spans"] if n.startswith("NEGOTIATE")]
        execute = [(a + shift, b - a) for _, n, a, b in r["spans"] if not n.startswith("NEGOTIATE")]
        ax.broken_barh(execute, (y, 0.8), color="C3", label="allreduce executing" if rank == 1 else None)
        labels.append(f"rank {rank}: executing")
        y += 1
        ax.broken_barh(
            negotiate, (y, 0.8), color="C7", alpha=0.5, label="gradient submitted, negotiating" if rank == 1 else None
        )
        labels.append(f"rank {rank}: negotiating")
        y += 1
        for phase, color in colors.items():
            bars = [(m[phase][0] - base, m[phase][1] - m[phase][0]) for m in r["marks"]]
            ax.broken_barh(bars, (y, 0.8), color=color, label=phase if rank == 1 else None)
        labels.append(f"rank {rank}: Python")
        y += 1
    ax.set_yticks([i + 0.4 for i in range(y)], labels)
    ax.set_xlabel("seconds")
    ax.set_title(f"{args.model}, {args.steps} steps on 2 hvdlite ranks; {results_file.machine_line()}", fontsize=9)
    ax.legend(fontsize=7, loc="upper right", ncol=5)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "step_timeline.png"), dpi=110)


if __name__ == "__main__":
    main()
