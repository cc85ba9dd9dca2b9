"""Alternated A/B of hvdlite settings or builds on the allreduce benchmark's hvdlite peer (2 ranks, one host).

    python bench/probes/env_ab.py --sizes 16777216,67108864 --turns 4 \\
        default: nostream:HVDLITE_STREAMING_STORE_BYTES=0 sc:HVDLITE_SINGLE_COPY_ALLREDUCE=1
    python bench/probes/env_ab.py --turns 4 old@/path/to/other/checkout: new:     # two builds, each its own .venv

Each configuration is NAME[@CHECKOUT]:VAR=VALUE,VAR=VALUE (CHECKOUT: another clone with its own .venv and built
core; default this one). Every turn runs each configuration once as a one-round `bench/allreduce.py --peers hvdlite`
job, the order reversed every other turn, so a slow period of the shared machine hits all alike. The fixed rules
(HVDLITE_ALLREDUCE_ALGORITHMS=fixed) unless a configuration sets that variable, so a measured table does not differ
between the arms. Prints each configuration's median time per size, its speedup over the first configuration
(median of the per-turn ratios) and in how many turns it was faster; --out keeps every figure as JSON.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse_config(text):
    name, _, settings = text.partition(":")
    checkout = ROOT
    if "@" in name:
        name, checkout = name.split("@", 1)
    # A comma starts a new setting only before VAR=, so a value may hold commas (an algorithm table).
    env = dict(item.split("=", 1) for item in re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", settings) if item)
    return name, os.path.abspath(checkout), env


def run_once(checkout, env, sizes):
    with tempfile.TemporaryDirectory() as out:
        python = os.path.join(checkout, ".venv", "bin", "python")
        subprocess.run([python if os.path.exists(python) else sys.executable, os.path.join(checkout, "bench", "allreduce.py"),
                        "--peers", "hvdlite", "--sizes", sizes, "--rounds", "1", "--out-dir", out],
                       env=dict(os.environ, **{"HVDLITE_ALLREDUCE_ALGORITHMS": "fixed", **env}), check=True,
                       capture_output=True, timeout=900)
        with open(os.path.join(out, "allreduce.json")) as f:
            return {r["bytes"]: r["median_s"] for r in json.load(f)["hvdlite"]["results"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+", help="NAME[@CHECKOUT]:VAR=VALUE,...; the first is the baseline")
    parser.add_argument("--sizes", default="1048576,4194304,16777216,67108864")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--out", help="write every figure here (JSON)")
    args = parser.parse_args()
    configs = [parse_config(c) for c in args.configs]
    figures = {name: [] for name, _, _ in configs}
    for turn in range(args.turns):
        for name, checkout, env in (configs if turn % 2 == 0 else configs[::-1]):
            figures[name].append(run_once(checkout, env, args.sizes))
            print(turn, name, {b: round(t * 1e6, 1) for b, t in figures[name][-1].items()}, flush=True)
    base = configs[0][0]
    for name, _, _ in configs:
        parts = []
        for size in figures[name][0]:
            ratios = [b[size] / x[size] for b, x in zip(figures[base], figures[name])]
            parts.append(f"{size >> 10} KB {statistics.median(x[size] for x in figures[name]) * 1e6:.0f} us "
                         f"x{statistics.median(ratios):.2f} (faster in {sum(r > 1 for r in ratios)}/{len(ratios)})")
        print(f"{name}: " + "; ".join(parts))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"configs": args.configs, "figures": {k: [{str(b): t for b, t in turn.items()} for turn in v]
                                                            for k, v in figures.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
