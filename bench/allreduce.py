"""Allreduce latency and bus bandwidth: hvdlite against torch.distributed (gloo) and MPI_Allreduce, in one run.

    python bench/allreduce.py                 # 2 ranks on this host, all available peers, writes bench/results/
    python bench/allreduce.py --peers hvdlite # only hvdlite
    python bench/allreduce.py --sizes 8,1048576 --rounds 1 --out-dir /tmp/quick   # a quick look at two sizes

Peers: hvdlite (built-in backend, started by hvdlite's own launcher; its allreduce algorithms per size come from
the machine's tuned table where python -m hvdlite.tune wrote one, else the fixed rules), hvdlite-fixed (the same
with the fixed rules, HVDLITE_ALLREDUCE_ALGORITHMS=fixed), hvdlite-mpi (hvdlite with the MPI data plane,
HVDLITE_CPU_OPERATIONS=mpi, started by mpirun), torch-gloo, and mpi (MPI_Allreduce through mpi4py); --variant adds
hvdlite with other settings.
Each peer runs as its own 2-process job with the same sizes and iteration rules; the peers take turns, and the
whole turn is repeated --rounds times, so a slow period of the shared machine hits every peer alike and a bimodal
result shows up as a gap between the median and the worst round. Bus bandwidth follows nccl-tests:
busbw = algbw * 2(n-1)/n, with algbw = bytes / time. Every peer reduces float32 tensors in place (hvdlite through
the hvdlite.torch API with a named tensor, as DistributedOptimizer does). A round's time is the median over
iterations on rank 0, after a warm-up; the table gives the median and the worst of the rounds, and each ratio
against hvdlite pairs the rounds (same turn) and reports their median and worst. The machine's slow periods hit
one turn and not the next: before and after every run, a framework-free 2 MB ping-pong between two
processes (bench/machine_state/pingpong.py) times its cross-core copies, and the report lists them and marks the
runs that fell in a slow period (a probe 1.3x above the fastest), so a worst round can be told apart from a worse
library (docs/benchmarks.md). A cache-line ping-pong (bench/machine_state/cacheline_pingpong.c, compiled once)
beside it shows where the host ran the two vCPUs, which on a VM decides how fast the ring and small messages run.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import results_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def sizes_from_env():
    """The driver hands its --sizes to the worker processes through the environment."""
    return [int(n) for n in os.environ["HVDLITE_BENCH_SIZES"].split(",")]


def iterations_for(nbytes):
    if nbytes <= 32 << 10:
        return 3000, 300
    if nbytes <= 1 << 20:
        return 300, 30
    if nbytes <= 16 << 20:
        return 40, 5
    return 15, 3


def measure(allreduce_inplace, barrier, make_tensor, rank):
    results = []
    for nbytes in sizes_from_env():
        tensor = make_tensor(max(1, nbytes // 4))
        iters, warmup = iterations_for(nbytes)
        for _ in range(warmup):
            allreduce_inplace(tensor)
        barrier()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            allreduce_inplace(tensor)
            times.append(time.perf_counter() - start)
        results.append({"bytes": nbytes, "median_s": statistics.median(times), "iters": iters})
    return results


def worker_hvdlite():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    result = measure(
        lambda t: hvd.allreduce_(t, name="bench", op=hvd.Sum),
        hvd.barrier,
        lambda n: torch.ones(n, dtype=torch.float32),
        hvd.rank(),
    )
    check = hvd.allreduce(torch.ones(3), name="check", op=hvd.Sum)
    assert check.tolist() == [float(hvd.size())] * 3, check
    if hvd.rank() == 0:  # which algorithms ran: a tuned table or the fixed rules
        print(
            "hvdlite " + ";".join(f for f in hvd.build_info().split(";") if f.startswith("allreduce_table")),
            flush=True,
        )
    return hvd.rank(), hvd.size(), result


def worker_torch():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    result = measure(
        lambda t: dist.all_reduce(t), dist.barrier, lambda n: torch.ones(n, dtype=torch.float32), dist.get_rank()
    )
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    return rank, size, result


def worker_mpi():
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    result = measure(
        lambda a: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM),
        comm.Barrier,
        lambda n: np.ones(n, dtype=np.float32),
        comm.Get_rank(),
    )
    return comm.Get_rank(), comm.Get_size(), result


# hvdlite started by its own launcher with these settings: the same library with a mechanism turned off.
VARIANTS = {
    "hvdlite": {},
    "hvdlite-fixed": {"HVDLITE_ALLREDUCE_ALGORITHMS": "fixed"},
}


def parse_variant(text):
    """'NAME:VAR=VALUE,VAR=VALUE' -> (NAME, {VAR: VALUE}); a value {fresh_dir} becomes a new empty folder per run."""
    name, _, settings = text.partition(":")
    env = dict(item.split("=", 1) for item in settings.split(",") if item)
    if not name or not env or not all(var.startswith(("HVDLITE_", "HOROVOD_")) for var in env):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME:HVDLITE_VAR=VALUE[,HVDLITE_VAR=VALUE]")
    return name, env


def run_worker(name, out_path):
    workers = {"hvdlite-mpi": worker_hvdlite, "torch-gloo": worker_torch, "mpi": worker_mpi}
    rank, size, result = workers.get(name, worker_hvdlite)()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"peer": name, "ranks": size, "results": result}, f)


def launch(peer, np_, out_path, sizes, variants):
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        HVDLITE_BENCH_SIZES=",".join(str(n) for n in sizes),
    )
    me = [sys.executable, os.path.abspath(__file__), "--worker", peer, "--out", out_path]
    if peer in variants:
        with tempfile.TemporaryDirectory(prefix="hvdlite-bench-") as fresh_dir:
            env.update({var: value.replace("{fresh_dir}", fresh_dir) for var, value in variants[peer].items()})
            cmd = [sys.executable, "-m", "hvdlite.runner.local", "-np", str(np_), "--"] + me
            return subprocess.run(cmd, env=env, timeout=900).returncode
    if peer in ("mpi", "hvdlite-mpi"):
        extra = ["--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else []
        cmd = ["mpirun", "-np", str(np_), "--bind-to", "none"] + extra + me
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if peer == "hvdlite-mpi":
            env["HVDLITE_CPU_OPERATIONS"] = "mpi"
        return subprocess.run(cmd, env=env, timeout=900).returncode
    # torch-gloo: start the ranks directly with torch.distributed's env:// rendezvous.
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), WORLD_SIZE=str(np_))
    procs = [subprocess.Popen(me, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(np_)]
    return max(p.wait(timeout=900) for p in procs)


def available(peer):
    if peer in ("mpi", "hvdlite-mpi"):
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            return False
        if peer == "hvdlite-mpi":
            sys.path.insert(0, ROOT)
            from hvdlite.common.build_queries import mpi_built

            if not mpi_built():
                return False
        return shutil.which("mpirun") is not None
    return True


SLOW_PERIOD_FACTOR = 1.3


def machine_probe():
    """Microseconds of one 2 MB ping-pong round trip between two processes (the machine's cross-core state)."""
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "machine_state", "pingpong.py")],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return float(out.split(":")[1].split("us")[0])


def placement_probe():
    """Nanoseconds of one cache-line round trip between two processes (bench/machine_state/cacheline_pingpong.c):
    on a VM it tells where the host runs the two vCPUs right now (docs/benchmarks.md: about 48 ns when they share a
    physical core, about 105 on two cores, about 480 farther apart), which decides the small-message mode.
    None when there is no C compiler. The probe is compiled once per source version, under ~/.cache/hvdlite."""
    source = os.path.join(HERE, "machine_state", "cacheline_pingpong.c")
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    binary = os.path.join(cache, "hvdlite", f"cacheline_pingpong-{digest}")
    if not os.path.exists(binary):
        compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            return None
        os.makedirs(os.path.dirname(binary), exist_ok=True)
        partial = f"{binary}.{os.getpid()}"
        subprocess.run([compiler, "-O2", "-o", partial, source], check=True, timeout=120)
        os.replace(partial, binary)  # atomic: a concurrent run never executes a half-written file
    if len(os.sched_getaffinity(0)) < 2:
        return None  # two busy-waiting processes on one CPU would pass the line once per scheduler slice
    try:
        out = subprocess.run([binary, "20000"], capture_output=True, text=True, timeout=60).stdout
    except subprocess.TimeoutExpired:
        return None
    return float(out.split("median")[1].split(",")[0])


def slow_runs(runs):
    """(peer, round index) of the runs whose ping-pong before or after was SLOW_PERIOD_FACTOR above the fastest."""
    probes = [us for run in runs.values() for pair in run["pingpong_us"] for us in pair]
    fastest = min(probes)
    return [
        (peer, i)
        for peer, run in runs.items()
        for i, pair in enumerate(run["pingpong_us"])
        if max(pair) > SLOW_PERIOD_FACTOR * fastest
    ]


def combine_rounds(rounds):
    """One peer's rounds -> {"peer", "ranks", "results": [{"bytes", "median_s", "worst_s", "rounds_s", "iters"}]}:
    median_s is the median of the rounds' medians, worst_s the slowest round."""
    first = rounds[0]
    results = []
    for i, r in enumerate(first["results"]):
        times = [run["results"][i]["median_s"] for run in rounds]
        results.append(
            {
                "bytes": r["bytes"],
                "median_s": statistics.median(times),
                "worst_s": max(times),
                "rounds_s": times,
                "iters": r["iters"],
            }
        )
    return {
        "peer": first["peer"],
        "ranks": first["ranks"],
        "results": results,
        "pingpong_us": [run["pingpong_us"] for run in rounds],
        "cacheline_ns": [run["cacheline_ns"] for run in rounds],
    }


def render(data):
    """The table of a run (bench/results_file.py): every peer against hvdlite, and the machine's state."""
    runs, np_, sizes = data["runs"], data["np"], data["sizes"]
    base = {r["bytes"]: r for r in runs["hvdlite"]["results"]}
    lines = [
        f"{np_} ranks, {data['rounds']} round(s) of every peer, interleaved",
        "",
        "| size | hvdlite time (us), median (worst) | hvdlite busbw (GB/s) | "
        + " | ".join(f"{p} busbw (GB/s) | {p} time / hvdlite time, median (worst)" for p in runs if p != "hvdlite")
        + " |",
    ]
    lines.append("|" + "---|" * (3 + 2 * (len(runs) - 1)))
    factor = 2 * (np_ - 1) / np_
    for nbytes in sizes:
        h = base[nbytes]
        h_bw = nbytes / h["median_s"] * factor / 1e9
        row = [human(nbytes), f"{h['median_s'] * 1e6:.1f} ({h['worst_s'] * 1e6:.1f})", f"{h_bw:.3f}"]
        for peer, run in runs.items():
            if peer == "hvdlite":
                continue
            p = {r["bytes"]: r for r in run["results"]}[nbytes]
            p_bw = nbytes / p["median_s"] * factor / 1e9
            row += [f"{p_bw:.3f} ({p['median_s'] * 1e6:.1f} us)", results_file.times(paired(p, h))]
        lines.append("| " + " | ".join(row) + " |")
    probes = "; ".join(
        f"{peer} " + ", ".join(f"{a:.0f}/{b:.0f}" for a, b in run["pingpong_us"]) for peer, run in runs.items()
    )
    placements = "; ".join(
        f"{peer} "
        + ", ".join("/".join("-" if ns is None else f"{ns:.0f}" for ns in pair) for pair in run["cacheline_ns"])
        for peer, run in runs.items()
    )
    slow = slow_runs(runs)
    lines += [
        "",
        f"Machine state: a 2 MB ping-pong between two processes before/after each run, us, by round: {probes}. "
        + (
            "Runs in a slow period of the machine (a probe over "
            f"{SLOW_PERIOD_FACTOR}x the fastest): " + ", ".join(f"{p} round {i + 1}" for p, i in slow)
            if slow
            else "No run fell in a slow period of the machine."
        ),
        "",
        "Where the host ran the two vCPUs: a cache-line round trip between two processes before/after each "
        f"run, ns, by round (about 48: one physical core; about 105: two cores; about 480: farther apart): "
        f"{placements}.",
    ]
    return "\n".join(lines)


def paired(peer, hvdlite):
    """The peer's time over hvdlite's, round by round: a slow period hits both runs of a turn alike."""
    ratios = [pt / ht for pt, ht in zip(peer["rounds_s"], hvdlite["rounds_s"])]
    return {"median": statistics.median(ratios), "worst": min(ratios), "rounds": ratios}


def headline(data):
    """One line for the summary of docs/benchmarks.md: the smallest size's latency and Open MPI's time over
    hvdlite's from 32 KB."""
    runs = data["runs"]
    hvdlite = runs["hvdlite"]["results"]
    text = f"{human(hvdlite[0]['bytes'])} in {hvdlite[0]['median_s'] * 1e6:.1f} us"
    if "mpi" in runs:
        mpi = runs["mpi"]["results"]
        text += f" (Open MPI {mpi[0]['median_s'] * 1e6:.1f} us)"
        large = [paired(p, h) for p, h in zip(mpi, hvdlite) if h["bytes"] >= 32 << 10]
        if large:
            text += (
                f"; from {human(32 << 10)} to {human(hvdlite[-1]['bytes'])}, "
                f"{min(r['median'] for r in large):.2f}-{max(r['median'] for r in large):.2f}x Open MPI's speed "
                f"({min(r['worst'] for r in large):.2f}-{max(r['worst'] for r in large):.2f}x in the worst round)"
            )
    return text


def report(runs, out_dir, np_, sizes, rounds=1):
    results_file.save(out_dir, "allreduce", {"np": np_, "rounds": rounds, "sizes": sizes, "runs": runs}, render)
    factor = 2 * (np_ - 1) / np_
    plt = pyplot()
    if plt is None:
        return
    fig, (ax_bw, ax_lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    for peer, run in runs.items():
        xs = [r["bytes"] for r in run["results"]]
        ax_bw.plot(xs, [r["bytes"] / r["median_s"] * factor / 1e9 for r in run["results"]], marker="o", label=peer)
        ax_lat.plot(xs, [r["median_s"] * 1e6 for r in run["results"]], marker="o", label=peer)
    for ax, label in ((ax_bw, "bus bandwidth (GB/s)"), (ax_lat, "median time per allreduce (us)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax_lat.set_yscale("log")
    fig.suptitle(f"allreduce, {np_} ranks on one host (float32, in place)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "allreduce.png"), dpi=110)


def pyplot():
    """matplotlib.pyplot drawing to files, or None (and a line saying so) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return None
    return plt


def human(n):
    for unit, div in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--peers", default="hvdlite,hvdlite-fixed,hvdlite-mpi,torch-gloo,mpi")
    parser.add_argument("--rounds", type=int, default=3, help="turns of every peer, interleaved (default 3)")
    parser.add_argument(
        "--sizes", default=",".join(str(n) for n in SIZES), help="message sizes in bytes, comma-separated"
    )
    parser.add_argument(
        "--out-dir",
        default=os.path.join(HERE, "results"),
        help="where allreduce.md, allreduce.json and the plot allreduce.png are written",
    )
    parser.add_argument(
        "--baseline-core",
        metavar="SO",
        help="also run peer hvdlite-baseline: hvdlite with this core library (HVDLITE_CORE_LIBRARY), "
        "e.g. the build of the commit before a change, for an A/B in the same run",
    )
    parser.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        default=[],
        metavar="NAME:VAR=VALUE[,...]",
        help="also run peer NAME: hvdlite with these settings, e.g. no-huge-pages:HVDLITE_HUGE_PAGE_BYTES=0, for "
        "an A/B of one mechanism in the same run (repeatable; a value {fresh_dir} is a new empty folder per run)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker, args.out)
        return
    os.makedirs(args.out_dir, exist_ok=True)
    sizes = [int(n) for n in args.sizes.split(",")]
    peers = []
    requested = args.peers.split(",")
    variants = dict(VARIANTS)
    if args.baseline_core:
        variants["hvdlite-baseline"] = {"HVDLITE_CORE_LIBRARY": os.path.abspath(args.baseline_core)}
        requested.insert(requested.index("hvdlite") + 1 if "hvdlite" in requested else 0, "hvdlite-baseline")
    for name, env in args.variant:
        variants[name] = env
        requested.append(name)
    for peer in requested:
        if available(peer):
            peers.append(peer)
        else:
            print(f"skipping {peer}: not installed")
    rounds = {peer: [] for peer in peers}
    for turn in range(args.rounds):
        for peer in peers:
            out_path = os.path.join(args.out_dir, f".raw-{peer}.json")
            print(f"round {turn + 1}/{args.rounds}: running {peer} ...", flush=True)
            before, placed_before = machine_probe(), placement_probe()
            rc = launch(peer, args.np, out_path, sizes, variants)
            if rc != 0:
                raise SystemExit(f"{peer} run failed with exit code {rc}")
            with open(out_path) as f:
                rounds[peer].append(
                    dict(
                        json.load(f),
                        pingpong_us=[before, machine_probe()],
                        cacheline_ns=[placed_before, placement_probe()],
                    )
                )
            os.remove(out_path)
    runs = {peer: combine_rounds(rounds[peer]) for peer in peers}
    report(runs, args.out_dir, args.np, sizes, args.rounds)


if __name__ == "__main__":
    main()
