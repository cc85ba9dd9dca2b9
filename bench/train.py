"""Training throughput: ResNet-50 (25.6M parameters), synthetic 3x64x64 images, batch 8 per rank, SGD with
momentum, one intra-op thread per rank. In one run: a single process, two independent single processes side by
side (no communication at all: the ceiling any 2-rank library can reach on this machine, since the two share its
memory bandwidth and caches), the same two processes in lockstep (they wait for each other after every step over a
local socket, bench/lockstep.py, and exchange no gradients: the most any synchronous library could reach), torch
DDP (gloo) on 2 ranks, and hvdlite on 2 ranks. Reports images/second and
scaling efficiency = (2-rank img/s) / (2 x single img/s).

    python bench/train.py [--steps 20] [--warmup 5] [--rounds 2]
    python bench/train.py --model resnet_small --image-size 32 --steps 2 --warmup 1 --rounds 1   # a smoke run

Runs are interleaved over --rounds (single, ddp, hvdlite, single, ...) so that load changes on a shared machine
hit every configuration alike. Each figure is taken within a round (against that round's single process and
ceiling); the report gives the median and the worst round (and the best), every round's figures, and each round's
load average at its start. Writes train.md, train.json and train.png (img/s of every round).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, HERE)

import lockstep  # noqa: E402
import results_file  # noqa: E402
from rounds import ratio_by_round, summarize  # noqa: E402


def build(model_name="resnet50", image_size=64, seed=0):
    import torch
    from models import MODELS

    torch.manual_seed(seed)
    model = MODELS[model_name]()
    data = torch.randn(8, 3, image_size, image_size)
    target = torch.randint(0, 1000, (8,))
    return model, data, target


AUTOTUNE_STEPS = 24  # warm-up steps of the autotune row: one warm-up window and the search's 20 windows, and slack


def timed_loop(step, warmup, steps, sync=lambda: None):
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return time.perf_counter() - start


def worker(kind, warmup, steps, out, model_name, image_size):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    model, data, target = build(model_name, image_size)
    wait_for_peer = None
    if kind in ("single", "lockstep"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        rank, size, sync = 0, 1, (lambda: None)
        net = model
        if kind == "lockstep":
            wait_for_peer = lockstep.peer_barrier()
            sync = wait_for_peer
    elif kind == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        net = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        sync = dist.barrier
    else:
        if kind == "hvdlite-autotune":
            # One window per step: the gradients' bytes. The search's 21 windows run before the timed steps.
            grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            os.environ.update(
                HVDLITE_AUTOTUNE="1",
                HVDLITE_AUTOTUNE_WINDOW_BYTES=str(grad_bytes),
                HVDLITE_AUTOTUNE_WARMUP_WINDOWS="1",
            )
            warmup = max(warmup, AUTOTUNE_STEPS)
        import hvdlite.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), named_parameters=model.named_parameters()
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        net, sync = model, hvd.barrier

    def step():
        optimizer.zero_grad()
        F.cross_entropy(net(data), target).backward()
        optimizer.step()
        if wait_for_peer:
            wait_for_peer()

    seconds = timed_loop(step, warmup, steps, sync)
    if rank == 0:
        result = {
            "kind": kind,
            "ranks": size,
            "seconds": seconds,
            "steps": steps,
            "img_per_s": size * 8 * steps / seconds,
        }
        if kind.startswith("hvdlite"):
            info = dict(kv.split("=", 1) for kv in hvd.build_info().split(";") if "=" in kv)
            result["knobs"] = {k: v for k, v in info.items() if k.isupper()}  # the settings this row ran with
        if kind == "hvdlite-autotune":
            result["tuned"] = {k: info.get(k) for k in ("autotune", "tuned_fusion_threshold", "tuned_cycle_time_ms")}
        with open(out, "w") as f:
            json.dump(result, f)
    if kind == "ddp":
        import torch.distributed as dist

        dist.destroy_process_group()


# Rows of hvdlite with other settings, in the same rounds as the default row: kind -> the variables it sets. The
# named ones come from their flags; --env-row adds "hvdlite-env<i>" rows, --fusion-mb "hvdlite-fusion<MB>" rows.
NAMED_ROWS = {
    "hvdlite-during-backward": {"HVDLITE_REDUCE_DURING_BACKWARD": "1"},
    "hvdlite-no-streaming": {"HVDLITE_STREAMING_STORE_BYTES": "0"},
    "hvdlite-fixed": {"HVDLITE_ALLREDUCE_ALGORITHMS": "fixed"},
}
ENV_ROWS = {}


def row_settings(kind):
    """The environment variables a row of hvdlite runs with, on top of the default row's."""
    if kind.startswith("hvdlite-fusion"):
        return {"HVDLITE_FUSION_THRESHOLD": str(int(kind[len("hvdlite-fusion") :]) << 20)}
    return dict(NAMED_ROWS.get(kind, ENV_ROWS.get(kind, {})))


def parse_env_row(text):
    """VAR=VALUE[,VAR=VALUE...]; a comma starts a new setting only before VAR=, so values may hold commas."""
    items = [item for item in re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", text) if item]
    if not items or any("=" not in item for item in items):
        raise argparse.ArgumentTypeError(f"--env-row takes VAR=VALUE[,VAR=VALUE...], not {text!r}")
    return dict(item.split("=", 1) for item in items)


def launch(kind, warmup, steps, out, model_name, image_size):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def worker_command(worker_kind, worker_out):
        return [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            worker_kind,
            "--warmup",
            str(warmup),
            "--steps",
            str(steps),
            "--out",
            worker_out,
            "--model",
            model_name,
            "--image-size",
            str(image_size),
        ]

    me = worker_command(kind, out)
    if kind == "single":
        return subprocess.run(me, env=env, timeout=1800).returncode
    if kind in ("independent", "lockstep"):  # two single processes at once; their images/second add up
        parts = [f"{out}.{i}" for i in range(2)]
        worker_kind = "single" if kind == "independent" else kind
        envs = lockstep.environments(env)
        procs = [subprocess.Popen(worker_command(worker_kind, part), env=envs[i]) for i, part in enumerate(parts)]
        code = max(p.wait(timeout=1800) for p in procs)
        if code == 0:
            halves = []
            for part in parts:
                with open(part) as f:
                    halves.append(json.load(f))
                os.remove(part)
            with open(out, "w") as f:
                json.dump(dict(halves[0], kind=kind, ranks=2, img_per_s=sum(h["img_per_s"] for h in halves)), f)
        return code
    env.update(row_settings(kind))
    if kind.startswith("hvdlite"):
        return subprocess.run(
            [sys.executable, "-m", "hvdlite.runner.local", "-np", "2", "--"] + me, env=env, timeout=1800
        ).returncode
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 1000), WORLD_SIZE="2")
    procs = [subprocess.Popen(me, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(2)]
    return max(p.wait(timeout=1800) for p in procs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="resnet50", help="resnet50 (default) or resnet_small")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument(
        "--autotune",
        action="store_true",
        help="add a row for hvdlite with HVDLITE_AUTOTUNE=1 (its search runs in extra warm-up steps)",
    )
    parser.add_argument(
        "--fusion-mb",
        default="",
        help="comma-separated fusion thresholds in MB: a row for hvdlite with each (paired with the "
        "default row in every round)",
    )
    parser.add_argument(
        "--during-backward",
        action="store_true",
        help="add a row for hvdlite reducing each gradient during backward "
        "(HVDLITE_REDUCE_DURING_BACKWARD=1), whatever the automatic choice is",
    )
    parser.add_argument(
        "--no-streaming",
        action="store_true",
        help="add a row for hvdlite without streaming stores into large results (HVDLITE_STREAMING_STORE_BYTES=0)",
    )
    parser.add_argument(
        "--fixed-algorithms",
        action="store_true",
        help="add a row for hvdlite with the fixed rules instead of a tuned table (ALLREDUCE_ALGORITHMS=fixed)",
    )
    parser.add_argument(
        "--env-row",
        action="append",
        default=[],
        type=parse_env_row,
        metavar="VAR=VALUE[,...]",
        help="add a row for hvdlite with these environment settings (repeatable), e.g. "
        "--env-row HVDLITE_SINGLE_COPY_ALLREDUCE_BYTES=4194304",
    )
    parser.add_argument("--worker")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.warmup, args.steps, args.out, args.model, args.image_size)
        return
    os.makedirs(args.out_dir, exist_ok=True)
    rounds = []
    kinds = (
        ("single", "independent", "lockstep", "ddp", "hvdlite")
        + (("hvdlite-autotune",) if args.autotune else ())
        + (("hvdlite-during-backward",) if args.during_backward else ())
        + (("hvdlite-no-streaming",) if args.no_streaming else ())
        + (("hvdlite-fixed",) if args.fixed_algorithms else ())
        + tuple(f"hvdlite-fusion{int(mb)}" for mb in args.fusion_mb.split(",") if mb)
    )
    for i, settings in enumerate(args.env_row):
        ENV_ROWS[f"hvdlite-env{i + 1}"] = settings
    kinds += tuple(ENV_ROWS)
    for r in range(args.rounds):
        for kind in kinds:
            path = os.path.join(args.out_dir, f".raw-train-{kind}.json")
            print(f"round {r + 1}: {kind} ...", flush=True)
            load = os.getloadavg()[0]
            if launch(kind, args.warmup, args.steps, path, args.model, args.image_size) != 0:
                raise SystemExit(f"{kind} run failed")
            with open(path) as f:
                rounds.append(dict(json.load(f), round=r + 1, load_average=round(load, 2)))
            os.remove(path)
    summary = summarize(rounds, kinds)
    labels = {kind: label(kind) for kind in kinds}
    labels["single"] = "single process, 1 thread"
    labels["independent"] = "2 independent single processes, no communication (the ceiling)"
    labels["lockstep"] = "the same 2 processes waiting for each other after every step (no gradients exchanged)"
    labels["ddp"] = "torch DDP (gloo), 2 ranks"
    labels["hvdlite-autotune"] = "hvdlite, 2 ranks, HVDLITE_AUTOTUNE=1"
    if args.autotune:
        tuned = [x["tuned"] for x in rounds if x["kind"] == "hvdlite-autotune"]
        chosen = ", ".join(
            f"{int(t['tuned_fusion_threshold']) >> 20} MB / {t['tuned_cycle_time_ms']} ms ({t['autotune']})"
            for t in tuned
        )
        labels["hvdlite-autotune"] += f" (chose per round: {chosen})"
    data = {
        "model": args.model,
        "image_size": args.image_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "kinds": list(kinds),
        "labels": labels,
        "rounds": rounds,
        "summary": summary,
        "hvdlite_over_ddp_by_round": ratio_by_round(rounds, "hvdlite", "ddp"),
        "hvdlite_over_lockstep_by_round": ratio_by_round(rounds, "hvdlite", "lockstep"),
    }
    results_file.save(args.out_dir, "train", data, render)
    plot(rounds, summary, args.out_dir)


def headline(data):
    """One line for the summary of docs/benchmarks.md: the median round, the worst in brackets."""
    hvdlite = data["summary"]["hvdlite"]
    return (
        f"{data['model']}: {hvdlite['efficiency']['median']:.1%} scaling ({hvdlite['efficiency']['worst']:.1%}), "
        f"{results_file.times(data['hvdlite_over_ddp_by_round'])} DDP, {results_file.times(hvdlite['of_ceiling'])} "
        "the ceiling of two independent processes"
    )


def render(data):
    """The table of a run (bench/results_file.py)."""
    summary, rounds_n = data["summary"], max(x["round"] for x in data["rounds"])
    lines = [
        f"{data['model']}, {data['image_size']}x{data['image_size']} images, batch 8 per rank, {data['steps']} timed "
        f"steps after {data['warmup']}, {rounds_n} interleaved round(s). Each figure is taken within a round (a "
        "configuration against the single process and the ceiling of the same round), then the median and the "
        "worst round are given.",
        "",
        "| configuration | img/s, median (worst - best) | scaling efficiency, median (worst) | "
        "/ the ceiling, median (worst) |",
        "|---|---|---|---|",
    ]
    for kind in data["kinds"]:
        row = summary[kind]
        lines.append(
            f"| {data['labels'][kind]} | {row['img_per_s']['median']:.2f} ({row['img_per_s']['worst']:.2f} - "
            f"{row['img_per_s']['best']:.2f}) | "
            + ("-" if kind == "single" else f"{row['efficiency']['median']:.1%} ({row['efficiency']['worst']:.1%})")
            + " | "
            + (
                "-"
                if kind in ("single", "independent")
                else f"{row['of_ceiling']['median']:.2f}x ({row['of_ceiling']['worst']:.2f}x)"
            )
            + " |"
        )
    versus_ddp, versus_lockstep = data["hvdlite_over_ddp_by_round"], data["hvdlite_over_lockstep_by_round"]
    lines += [
        "",
        "hvdlite / DDP img/s by round: "
        + ", ".join(f"{v:.2f}x" for v in versus_ddp["rounds"])
        + f" (median {versus_ddp['median']:.2f}x, worst {versus_ddp['worst']:.2f}x); hvdlite / ceiling by round: "
        + ", ".join(f"{v:.2f}x" for v in summary["hvdlite"]["of_ceiling"]["rounds"])
        + "; hvdlite / lockstep by round: "
        + ", ".join(f"{v:.2f}x" for v in versus_lockstep["rounds"]),
        "",
        "All rounds (img/s, load average at the start): "
        + ", ".join(f"{x['kind']} {x['img_per_s']:.2f} ({x['load_average']:.1f})" for x in data["rounds"]),
    ]
    return "\n".join(lines)


def label(kind, short=False):
    if kind in ENV_ROWS:
        settings = ", ".join(f"{k}={v}" for k, v in ENV_ROWS[kind].items())
        return f"hvdlite, {kind[len('hvdlite-') :]}" if short else f"hvdlite, 2 ranks, {settings}"
    if kind.startswith("hvdlite-fusion"):
        mb = kind[len("hvdlite-fusion") :]
        return f"hvdlite, {mb} MB fusion" if short else f"hvdlite, 2 ranks, FUSION_THRESHOLD={mb} MB"
    if kind in NAMED_ROWS and not short:
        return "hvdlite, 2 ranks, " + ", ".join(f"{k}={v}" for k, v in NAMED_ROWS[kind].items())
    return {
        "single": "single process",
        "independent": "2 independent",
        "lockstep": "2 in lockstep",
        "ddp": "torch DDP, 2 ranks",
        "hvdlite": "hvdlite, 2 ranks",
        "hvdlite-autotune": "hvdlite, autotuned",
        "hvdlite-during-backward": "hvdlite, during bwd",
        "hvdlite-no-streaming": "hvdlite, no streaming stores",
        "hvdlite-fixed": "hvdlite, fixed rules",
    }[kind]


def plot(rounds, summary, out_dir):
    """img/s of every round, per configuration (bars: the median round), with the 2-rank ideal (twice the single
    process's median)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(summary)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, kind in enumerate(kinds):
        values = [x["img_per_s"] for x in rounds if x["kind"] == kind]
        middle = summary[kind]["img_per_s"]["median"]
        ax.bar(i, middle, color=f"C{i}", alpha=0.35, label=f"{kind}: median {middle:.1f}")
        ax.scatter([i] * len(values), values, color=f"C{i}", zorder=3)
    ax.axhline(
        2 * summary["single"]["img_per_s"]["median"],
        color="grey",
        linestyle="--",
        label="2 x single (ideal for 2 ranks)",
    )
    ax.set_xticks(range(len(kinds)), [label(k, short=True) for k in kinds], fontsize=8)
    ax.set_ylabel("images / second (dots: every round)")
    ax.set_title(results_file.machine_line(), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "train.png"), dpi=110)


if __name__ == "__main__":
    main()
