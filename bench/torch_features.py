"""Today's PyTorch with hvdlite, against its own eager and unsharded steps and against DDP, in one run.

    python bench/torch_features.py                    # 2 ranks, 3 interleaved rounds, writes bench/results/
    python bench/torch_features.py --rounds 1 --layers 2 --out-dir /tmp/quick

The model is bench/fixed_costs.py's GPT-style transformer (--layers blocks), AdamW, one torch thread per rank.

- compile: a training step through hvd.DistributedOptimizer with the model eager and torch.compile'd (inductor),
  in the same job (compile-hvdlite); compilation happens in the warm-up steps, which are not timed.
- zero: the step and each rank's optimizer-state bytes with DistributedOptimizer unsharded and with
  shard_optimizer_state=True (zero-hvdlite), and DistributedDataParallel with AdamW unsharded and with torch's
  ZeroRedundancyOptimizer (zero-ddp, gloo).

Peers take turns and the whole turn repeats --rounds times; each figure is the median step within a run, the
table gives the median and the worst round, and ratios are taken within a round.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import results_file  # noqa: E402
from fixed_costs import GPT, init_peer, ratio_spread, run_rounds, spread, time_steps  # noqa: E402

PEERS = ["compile-hvdlite", "zero-hvdlite", "zero-ddp"]
LAYERS = 8
STEPS = 20


def worker(peer):
    import torch

    from hvdlite.torch.sharded_state import state_bytes

    torch.set_num_threads(1)
    layers = int(os.environ["HVDLITE_BENCH_LAYERS"])
    rank, size, barrier, hvd = init_peer(peer == "zero-ddp")
    inputs, targets = GPT.batch(rank)
    results = {}
    variants = {
        "compile-hvdlite": ("eager", "compiled"),
        "zero-hvdlite": ("unsharded", "sharded"),
        "zero-ddp": ("unsharded", "sharded"),
    }[peer]
    for variant in variants:
        model = GPT.build(layers)
        if peer == "zero-ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
            if variant == "sharded":
                from torch.distributed.optim import ZeroRedundancyOptimizer

                optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
            else:
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            optimizer = hvd.DistributedOptimizer(
                torch.optim.AdamW(model.parameters(), lr=1e-3),
                named_parameters=model.named_parameters(),
                shard_optimizer_state=variant == "sharded",
            )
        forward = torch.compile(model) if variant == "compiled" else model

        def step():
            optimizer.zero_grad()
            logits = forward(inputs)
            torch.nn.functional.cross_entropy(logits.reshape(-1, GPT.VOCAB), targets).backward()
            optimizer.step()

        seconds = time_steps(step, barrier, STEPS)
        local = optimizer.optim if peer == "zero-ddp" and variant == "sharded" else optimizer
        results[variant] = {"seconds": seconds, "state_bytes": state_bytes(local)}
    if hvd is None:
        torch.distributed.destroy_process_group()
    return rank, size, {"layers": layers, "variants": results}


def summarize(rounds):
    out = {}
    for peer in PEERS:
        runs = [rd[peer]["variants"] for rd in rounds if peer in rd]
        if not runs:
            continue
        out[peer] = {
            variant: {
                "step": spread([r[variant]["seconds"] for r in runs]),
                "state_bytes": runs[0][variant]["state_bytes"],
            }
            for variant in runs[0]
        }

    def seconds(peer, variant):
        return lambda results: results["variants"][variant]["seconds"]

    ratios = {}
    for name, (over, under) in {
        "eager_over_compiled": (("compile-hvdlite", "eager"), ("compile-hvdlite", "compiled")),
        "unsharded_over_sharded": (("zero-hvdlite", "unsharded"), ("zero-hvdlite", "sharded")),
        "ddp_zero_over_sharded": (("zero-ddp", "sharded"), ("zero-hvdlite", "sharded")),
        "ddp_over_unsharded": (("zero-ddp", "unsharded"), ("zero-hvdlite", "unsharded")),
    }.items():
        paired = [rd for rd in rounds if over[0] in rd and under[0] in rd]
        if paired:
            ratios[name] = ratio_spread(
                [seconds(*over)(rd[over[0]]) / seconds(*under)(rd[under[0]]) for rd in paired]
            )
    out["ratios"] = ratios
    return out


def _cell(s, scale=1e3, digits=1):
    return f"{s['median'] * scale:.{digits}f} ({s['worst'] * scale:.{digits}f})" if s else "-"


def report_lines(summary, layers, size):
    lines = []
    ratios = summary.get("ratios", {})
    tensors = sum(1 for _ in GPT.build(layers).parameters()) if layers else 0
    if "compile-hvdlite" in summary:
        c = summary["compile-hvdlite"]
        lines += [
            "",
            f"| GPT-style, {layers} blocks, {tensors} tensors, AdamW, {size} ranks | step (ms) "
            "| eager time / compiled time |",
            "|---|---|---|",
            f"| DistributedOptimizer, eager model | {_cell(c['eager']['step'])} | |",
            f"| DistributedOptimizer, torch.compile (inductor) | {_cell(c['compiled']['step'])} | "
            f"{_cell(ratios.get('eager_over_compiled'), 1, 2)}x |",
        ]
    if "zero-hvdlite" in summary or "zero-ddp" in summary:
        lines += [
            "",
            "| optimizer state | step (ms) | state per rank (MB) |",
            "|---|---|---|",
        ]
        for peer, label in (("zero-hvdlite", "DistributedOptimizer"), ("zero-ddp", "DDP (gloo)")):
            for variant, what in (("unsharded", "AdamW"), ("sharded", "sharded")):
                row = summary.get(peer, {}).get(variant)
                if row:
                    name = (
                        f"{label}, {what}"
                        if peer == "zero-hvdlite" or variant == "unsharded"
                        else (f"{label}, ZeroRedundancyOptimizer")
                    )
                    lines.append(f"| {name} | {_cell(row['step'])} | {row['state_bytes'] / 1e6:.2f} |")
        lines.append("")
        for key, text in (
            ("unsharded_over_sharded", "hvdlite unsharded time / sharded time"),
            ("ddp_zero_over_sharded", "DDP + ZeroRedundancyOptimizer time / hvdlite sharded time"),
            ("ddp_over_unsharded", "DDP + AdamW time / hvdlite unsharded time"),
        ):
            if key in ratios:
                lines.append(f"- {text}: {_cell(ratios[key], 1, 2)}x")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=LAYERS, help="transformer blocks")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        rank, _, results = worker(args.worker)
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump(results, f)
        return
    os.makedirs(args.out_dir, exist_ok=True)
    os.environ["HVDLITE_BENCH_LAYERS"] = str(args.layers)
    rounds = run_rounds(
        args.peers.split(","), args.rounds, args.np, args.out_dir, [], script=os.path.abspath(__file__)
    )
    data = {"np": args.np, "rounds": args.rounds, "layers": args.layers, "summary": summarize(rounds)}
    results_file.save(args.out_dir, "torch_features", data, render)


def headline(data):
    """One line for the summary of docs/benchmarks.md: the median round, the worst in brackets."""
    ratios = data["summary"]["ratios"]
    return (
        f"a `torch.compile`'d transformer trains {results_file.times(ratios['eager_over_compiled'])} as fast as the "
        f"eager one; `shard_optimizer_state=True` at {results_file.times(ratios['unsharded_over_sharded'])} the "
        f"unsharded speed, {results_file.times(ratios['ddp_zero_over_sharded'])} DDP with `ZeroRedundancyOptimizer`"
    )


def render(data):
    """The tables of a run (bench/results_file.py)."""
    lines = [f"{data['np']} ranks, {data['rounds']} round(s) of every peer, interleaved"]
    lines += report_lines(data["summary"], data["layers"], data["np"])
    lines += ["", "Each cell: median of the rounds (worst round); ratios are taken within a round."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
