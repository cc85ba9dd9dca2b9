"""Which flat allreduce algorithm wins in which vCPU placement (docs/benchmarks.md, issue 11's far placement).

On this VM the host moves the two vCPUs between one physical core, two cores and farther apart every few seconds
(bench/probes/cacheline_pingpong.c tells which), and a table measured once at init cannot follow. This job takes
turns, block after block: rank 0 probes the placement, then the job re-initialises hvdlite once per candidate
algorithm (the ring through shared-memory rings, single-copy cross-memory attach) and times each size with it,
the candidates' order rotating from block to block. Each line printed is one block:

    <UTC time> placement_ns=<before>/<after> <algorithm>:<size>=<median us>,... ...

Run from the repository root (2 ranks):
    .venv/bin/hvdlite-run -np 2 .venv/bin/python bench/probes/algorithms_vs_placement.py --blocks 30
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "jobs"))
from allreduce import placement_probe  # noqa: E402
from hvdlite.common import basics  # noqa: E402
from numpy_collectives import allreduce  # noqa: E402

# Each candidate is the environment that forces it (fixed rules, so no measured table overrides them).
CANDIDATES = {
    "ring": {"HVDLITE_ALLREDUCE_ALGORITHMS": "fixed", "HVDLITE_SINGLE_COPY_ALLREDUCE": "0"},
    "single_copy": {"HVDLITE_ALLREDUCE_ALGORITHMS": "fixed", "HVDLITE_SINGLE_COPY_ALLREDUCE": "1"},
}


def time_size(buffer, nbytes, repeats):
    view = buffer[: nbytes // 4]
    name = f"probe.{nbytes}"
    allreduce(view, name)  # warm-up: first touch of the rings and the pages
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        allreduce(view, name)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def probe_placement(rank):
    """Rank 0 probes while rank 1 waits in an allreduce (which sleeps after a short spin), so the probe has both
    CPUs to itself."""
    ns = placement_probe() if rank == 0 else None
    allreduce(np.zeros(1, dtype=np.float32), "probe.sync")
    return ns


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--sizes", default="262144,1048576,4194304,16777216,67108864")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--ring-bytes", default="",
                        help="also the ring with these shared-memory ring sizes (HVDLITE_SHM_RING_BYTES), as "
                             "candidates ring<KiB>K, interleaved with the others")
    parser.add_argument("--json", help="rank 0 writes every block here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    candidates = args.candidates.split(",")
    # Every candidate names its ring size, so that one candidate's size does not carry over to the next.
    default_ring = os.environ.get("HVDLITE_SHM_RING_BYTES", str(1 << 20))  # the default (config.h)
    for env in CANDIDATES.values():
        env.setdefault("HVDLITE_SHM_RING_BYTES", default_ring)
    for ring_bytes in filter(None, args.ring_bytes.split(",")):
        name = f"ring{int(ring_bytes) >> 10}K"
        CANDIDATES[name] = dict(CANDIDATES["ring"], HVDLITE_SHM_RING_BYTES=ring_bytes)
        candidates.append(name)
    buffer = np.ones(max(sizes) // 4, dtype=np.float32)
    blocks = []
    basics.init()
    rank = basics.rank()
    for block in range(args.blocks):
        order = candidates[block % len(candidates):] + candidates[: block % len(candidates)]
        before = probe_placement(rank)
        figures = {}
        for candidate in order:
            basics.shutdown()
            os.environ.update(CANDIDATES[candidate])
            basics.init()
            # First touch: the largest size once pushes more than a ring's worth through every shared-memory
            # ring, whose pages a fresh runtime has not faulted in yet (measure_allreduce.cc does the same).
            allreduce(buffer, "probe.first_touch")
            figures[candidate] = {n: time_size(buffer, n, max(3, min(40, (32 << 20) // n))) for n in sizes}
        after = probe_placement(rank)
        if rank == 0:
            text = " ".join(f"{c}:" + ",".join(f"{n >> 10}K={us:.0f}" for n, us in figures[c].items())
                            for c in candidates)
            print(f"{time.strftime('%H:%M:%S', time.gmtime())} placement_ns={before:.0f}/{after:.0f} {text}",
                  flush=True)
            blocks.append({"placement_ns": [before, after], "us": figures})
    basics.shutdown()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"sizes": sizes, "blocks": blocks}, f, indent=1)


if __name__ == "__main__":
    main()
