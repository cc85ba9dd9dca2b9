"""python -m hvdlite.tune: measure this machine's allreduce algorithms and write its tuned table.

Without a tuned table every job runs the fixed rules (docs/decisions/018-choosing-an-algorithm.md). Where a machine
ranks the algorithms differently (its caches, its cross-core copies), the tuner finds out the way the rules were
chosen: it runs short jobs of as many ranks as the training will run on one host, each with one algorithm named
(HVDLITE_ALLREDUCE_ALGORITHMS), times in-place allreduces of each probe size through the same path a training step
takes, and repeats the whole turn over several rounds. At each size the table keeps the fixed rules' algorithm
unless another was clearly faster (by 10%) in most rounds; the ring's streaming stores likewise. It writes the table
where later jobs of that size read it at init (~/.cache/hvdlite by default; HVDLITE_ALGORITHM_CACHE_DIR to choose).
Give it the machine to itself: it takes under a minute.

    python -m hvdlite.tune            # for jobs of 2 ranks on this host
    python -m hvdlite.tune -np 4      # for jobs of 4 ranks on this host

HVDLITE_ALLREDUCE_ALGORITHMS=fixed (or any knob of the fixed rules) makes a job ignore the table; deleting the
file forgets it.
"""

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Sequence

PROBE_BYTES = (4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
SMALL_MESSAGE_BYTES = 64 << 10  # the fixed rules: recursive doubling below this, the ring from it...
SINGLE_COPY_BYTES = 16 << 20  # ...and single copy from this size (HVDLITE_SINGLE_COPY_ALLREDUCE_BYTES)
STREAMING_STORE_BYTES = 64 << 20  # the ring's streaming stores from this size (HVDLITE_STREAMING_STORE_BYTES)
CLEAR_MARGIN = 0.9  # another candidate replaces the fixed rules' one only where it takes under 0.9 of its time
HEADER = "hvdlite allreduce table v4"

# Each candidate: the settings of its jobs, and the probe sizes where it is worth timing.
CANDIDATES = {
    "rd": ({"HVDLITE_ALLREDUCE_ALGORITHMS": "rd"}, lambda n: n <= 256 << 10),
    "ring": ({"HVDLITE_ALLREDUCE_ALGORITHMS": "ring", "HVDLITE_STREAMING_STORE_BYTES": "0"}, lambda n: True),
    "ring_streaming": (
        {"HVDLITE_ALLREDUCE_ALGORITHMS": "ring", "HVDLITE_STREAMING_STORE_BYTES": "1"},
        lambda n: n >= 4 << 20,
    ),
    "single_copy": ({"HVDLITE_ALLREDUCE_ALGORITHMS": "single_copy"}, lambda n: n >= 32 << 10),
}


def _iterations(nbytes: int):
    """(timed, warm-up) allreduces per size: about the same time at every size."""
    if nbytes <= 32 << 10:
        return 400, 50
    if nbytes <= 1 << 20:
        return 100, 10
    if nbytes <= 16 << 20:
        return 20, 3
    return 8, 2


def _time_on_this_rank(sizes: Sequence[int]):
    """In a job: (build_info, {bytes: median seconds}) of in-place float32 sums, through the path hvdlite.torch's
    allreduce_ takes (one cached request, one call into the core)."""
    import numpy as np

    from hvdlite.common import basics, ops

    basics.init()
    try:
        medians = {}
        for nbytes in sizes:
            buffer = np.zeros(nbytes // 4, dtype=np.float32)
            request = ops.request(
                basics.OP_ALLREDUCE,
                f"hvdlite.tune.{nbytes}",
                ops.DTYPE_CODES["float32"],
                buffer.shape,
                buffer.ctypes.data,
                buffer.ctypes.data,
                reduce_op=ops.CORE_REDUCE_OPS[ops.Sum],
            )
            timed, warm_up = _iterations(nbytes)
            seconds = []
            for i in range(warm_up + timed):
                start = time.perf_counter()
                ops.run(request, buffer)
                if i >= warm_up:
                    seconds.append(time.perf_counter() - start)
            medians[nbytes] = statistics.median(seconds)
        return basics.build_info(), medians
    finally:
        basics.shutdown()


def _parse_info(text: str) -> Dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(";") if "=" in item)


def fixed_rule(nbytes: int) -> str:
    if nbytes >= SINGLE_COPY_BYTES:
        return "single_copy"
    return "rd" if nbytes < SMALL_MESSAGE_BYTES else "ring"


def choose(rounds: List[Dict[str, Dict[int, float]]], sizes: Sequence[int]):
    """(table bands [(min_bytes, algorithm)], streaming store bytes or None where not measured) from the rounds'
    figures: rounds[r][candidate][bytes] = seconds (the slowest rank's median)."""
    bands = []
    for i, nbytes in enumerate(sizes):
        candidates = [c for c in ("rd", "ring", "single_copy") if nbytes in rounds[0].get(c, {})]
        fixed = fixed_rule(nbytes)
        if fixed not in candidates:
            fixed = "ring"
        votes = {c: 0 for c in candidates}
        for figures in rounds:
            best = min(candidates, key=lambda c: figures[c][nbytes])
            if figures[best][nbytes] < CLEAR_MARGIN * figures[fixed][nbytes]:
                votes[best] += 1
        chosen = max(candidates, key=lambda c: votes[c])
        if 2 * votes[chosen] <= len(rounds):
            chosen = fixed
        if bands and bands[-1][1] == chosen:
            continue
        start = 0 if not bands else int(math.sqrt(sizes[i - 1] * nbytes))
        bands.append((start, chosen))
    # Streaming stores: from the smallest probe from which they were not slower in most rounds, at every larger
    # probe too; never (0), where they were slower at the largest.
    probed = [n for n in sizes if n in rounds[0].get("ring_streaming", {})]
    streaming = 0 if probed else None
    for nbytes in reversed(probed):
        wins = sum(figures["ring_streaming"][nbytes] <= figures["ring"][nbytes] for figures in rounds)
        if 2 * wins <= len(rounds):
            break
        streaming = nbytes
    return bands, streaming


def write_table(path: str, key: str, bands, streaming: int, rounds, sizes) -> None:
    lines = [HEADER, key, "allreduce " + ",".join(f"{algorithm}@{start}" for start, algorithm in bands)]
    if streaming is not None:
        lines.append(f"streaming_store_bytes {streaming}")
    for figures in rounds:
        lines.append(
            "measured "
            + "; ".join(
                f"{candidate} " + ",".join(f"{n}:{seconds:.6g}" for n, seconds in sorted(by_size.items()))
                for candidate, by_size in figures.items()
            )
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Atomic: a job starting meanwhile reads the old file or the new one, never half of one.
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tune-")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(temporary, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hvdlite.tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-np", "--num-proc", dest="np", type=int, default=2, help="ranks on this host (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="turns of every candidate (default 5)")
    parser.add_argument(
        "--sizes", default=",".join(map(str, PROBE_BYTES)), help="probe sizes in bytes, ascending, comma-separated"
    )
    args = parser.parse_args(argv)
    if args.np < 2:
        parser.error("-np must be at least 2: a tuned table is for jobs of several ranks on one host")
    sizes = sorted(int(n) for n in args.sizes.split(","))
    from hvdlite.runner.api import run

    info = None
    rounds = []
    for turn in range(args.rounds):
        figures = {}
        for candidate, (settings, worth) in CANDIDATES.items():
            if candidate == "single_copy" and info is not None and info.get("cma") != "1":
                continue  # the ranks cannot reach each other's memory: single copy would run the ring
            probes = [n for n in sizes if worth(n)]
            if not probes:
                continue
            # The tuner measures the built-in data plane (MPI runs its own algorithms), without any table.
            env = dict(settings, HVDLITE_CPU_OPERATIONS="builtin")
            results = run(_time_on_this_rank, args=(probes,), np=args.np, env=env)
            info = info or _parse_info(results[0][0])
            figures[candidate] = {n: max(r[1][n] for r in results) for n in probes}
            print(
                f"round {turn + 1}/{args.rounds} {candidate}: "
                + ", ".join(f"{n} B {s * 1e6:.1f} us" for n, s in figures[candidate].items()),
                flush=True,
            )
        rounds.append(figures)
    if "allreduce_table_file" not in info:
        raise SystemExit("hvdlite.tune: no directory for the tuned table: set HVDLITE_ALGORITHM_CACHE_DIR")
    bands, streaming = choose(rounds, sizes)
    write_table(info["allreduce_table_file"], info["allreduce_table_key"], bands, streaming, rounds, sizes)
    print(
        f"wrote {info['allreduce_table_file']}\n"
        f"  allreduce algorithms by size: {','.join(f'{a}@{s}' for s, a in bands)}\n"
        + (
            f"  streaming stores from: {streaming or 'never'}" + (" bytes" if streaming else "")
            if streaming is not None
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
