"""Counts, over bench/allreduce.py results, how often a round was slow at 1-4 MB next to each vCPU placement.

    python bench/placement_vs_slow_rounds.py bench/results/allreduce-morning/*/allreduce.json

A round is "slow" when its 1 MB allreduce took more than --slow-1mb-us or its 4 MB one more than --slow-4mb-us
(defaults: about 3x the usual time on the 2-vCPU AMD EPYC VM); a placement is "far" when the cache-line round trip
measured before or after the round (`cacheline_ns`) was at least --far-ns. Prints a 2x2 table per peer, so that a
slow round can be put on the machine (both peers slow when far) or on the library (one peer slow when near).
"""
import argparse
import json
from collections import Counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="allreduce.json files written by bench/allreduce.py")
    parser.add_argument("--far-ns", type=float, default=400.0)
    parser.add_argument("--slow-1mb-us", type=float, default=200.0)
    parser.add_argument("--slow-4mb-us", type=float, default=1000.0)
    args = parser.parse_args()
    tables = {}
    for path in args.files:
        with open(path) as f:
            runs = json.load(f)
        for peer, run in runs.items():
            if not isinstance(run, dict) or not run.get("cacheline_ns"):
                continue
            by_size = {r["bytes"]: r["rounds_s"] for r in run["results"]}
            if 1 << 20 not in by_size or 4 << 20 not in by_size:
                continue
            for k, probes in enumerate(run["cacheline_ns"]):
                far = any(p is not None and p >= args.far_ns for p in probes)
                slow = by_size[1 << 20][k] * 1e6 > args.slow_1mb_us or by_size[4 << 20][k] * 1e6 > args.slow_4mb_us
                tables.setdefault(peer, Counter())[(far, slow)] += 1
    for peer, t in tables.items():
        for far in (False, True):
            total = t[(far, False)] + t[(far, True)]
            print(f"{peer}: {'far' if far else 'near'} placement ({total} rounds): {t[(far, True)]} slow")


if __name__ == "__main__":
    main()
