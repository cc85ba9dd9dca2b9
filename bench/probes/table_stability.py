"""How stable is the one-host allreduce table from one measurement, and from the median of three?

Each group starts with an empty cache directory and runs three short 2-rank jobs in it, as the first three jobs on
a fresh machine would: each measures at init and adds its figures to the cache file (runtime/algorithm_cache.h).
With --busy, a busy-looping process shares the machine during the second job of every group, as a CI run beside
a training job would. For every measurement the script derives the table that measurement alone would give (the
same rule as AllreduceTable::from_probes), reads the table the three gave together (their vote,
AllreduceTable::from_measurements) from the file, and derives the tables of the two rules tried before the vote:
each figure's median of the three, and each figure's fastest.

Run from the repository root:
    .venv/bin/python bench/probes/table_stability.py --groups 4 --busy --json out.json
"""
import argparse
import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, ".."))
from allreduce import placement_probe  # noqa: E402

NAMES = ("rd", "ring", "single_copy")
CLEAR_MARGIN = 0.9  # AllreduceTable::kClearMargin
SMALL_MESSAGE_BYTES = 64 << 10  # the default SMALL_MESSAGE_BYTES

JOB = "from hvdlite.common import basics; basics.init(); basics.shutdown()"


def parse_measurement(line):
    """'measured <probes> streaming <ring's store modes>' (cache v3) -> the probes."""
    probes = []
    for item in line.split(" ", 1)[1].split(" streaming ")[0].split(";"):
        size, figures = item.split(":")
        probes.append((int(size), [float(x) for x in figures.split(",")]))
    return probes


def table_of(probes):
    """Python twin of AllreduceTable::from_probes, for one measurement on its own."""
    bands = []
    for i, (size, seconds) in enumerate(probes):
        candidates = [a for a in range(3) if seconds[a] >= 0]
        if not candidates:
            continue
        best = min(candidates, key=lambda a: seconds[a])
        fixed = 0 if size < SMALL_MESSAGE_BYTES else 1
        if seconds[fixed] >= 0 and not seconds[best] < CLEAR_MARGIN * seconds[fixed]:
            best = fixed
        start = 0 if i == 0 else int(math.sqrt(probes[i - 1][0] * size))
        if bands and bands[-1][0] == NAMES[best]:
            continue
        bands.append((NAMES[best], 0 if not bands else start))
    return ",".join("%s@%d" % band for band in bands)


def per_figure(measurements, pick):
    """One measurement whose every figure is pick(that figure in each measurement): the rules tried before the vote."""
    return [(size, [pick(sorted(m[i][1][a] for m in measurements)) for a in range(3)])
            for i, (size, _) in enumerate(measurements[0])]


def busy(seconds):
    end = time.time() + seconds
    while time.time() < end:
        pass


def run_job(cache_dir, load):
    env = dict(os.environ, HVDLITE_ALGORITHM_CACHE_DIR=cache_dir, HVDLITE_LOG_LEVEL="warning")
    burner = None
    if load:
        burner = multiprocessing.Process(target=busy, args=(60,))
        burner.start()
    try:
        subprocess.run([sys.executable, "-m", "hvdlite.runner.local", "-np", "2", "--", sys.executable, "-c", JOB],
                       env=env, check=True, timeout=120, capture_output=True, cwd=ROOT)
    finally:
        if burner is not None:
            burner.terminate()
            burner.join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--busy", action="store_true", help="a busy loop beside the second job of each group")
    parser.add_argument("--json", help="write the groups here")
    args = parser.parse_args()
    groups = []
    for g in range(args.groups):
        with tempfile.TemporaryDirectory() as cache_dir:
            placements = []
            for job in range(3):
                placements.append(placement_probe())
                run_job(cache_dir, load=args.busy and job == 1)
            (path,) = [os.path.join(cache_dir, f) for f in os.listdir(cache_dir) if f.startswith("allreduce-")]
            lines = open(path).read().splitlines()
        measurements = [parse_measurement(line) for line in lines[3:]]
        group = {"time": time.strftime("%H:%M:%S", time.gmtime()), "placement_ns": placements,
                 "single_tables": [table_of(m) for m in measurements], "combined_table": lines[2],
                 "median_table": table_of(per_figure(measurements, lambda xs: xs[(len(xs) - 1) // 2])),
                 "fastest_table": table_of(per_figure(measurements, lambda xs: xs[0])),
                 "measurements": [{str(size): seconds for size, seconds in m} for m in measurements]}
        groups.append(group)
        print("group %d %s placement_ns=%s alone: %s | vote: %s | median: %s | fastest: %s" % (
            g, group["time"], "/".join("%.0f" % p if p else "?" for p in placements),
            " ; ".join(group["single_tables"]), group["combined_table"], group["median_table"],
            group["fastest_table"]), flush=True)
        for i, m in enumerate(measurements):
            print("   job %d%s: %s" % (i, " (busy)" if args.busy and i == 1 else "", "  ".join(
                "%dK:%s" % (size >> 10, "/".join("%.0f" % (s * 1e6) if s >= 0 else "-" for s in seconds))
                for size, seconds in m)), flush=True)
    # The table most single measurements gave stands for the machine's; how often each rule missed it:
    singles = [t for group in groups for t in group["single_tables"]]
    modal = max(set(singles), key=singles.count)
    summary = {"modal_table": modal, "single_measurements_off": sum(t != modal for t in singles),
               "single_measurements": len(singles)}
    for rule in ("combined", "median", "fastest"):
        summary[rule + "_groups_off"] = sum(group[rule + "_table"] != modal for group in groups)
    print("summary", json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"busy_second_job": args.busy, "summary": summary, "groups": groups}, f, indent=1)


if __name__ == "__main__":
    main()
