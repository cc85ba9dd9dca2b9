"""Collectives on CUDA tensors on one GPU: hvdlite against torch.distributed, in the same run.

    python bench/gpu_collectives.py --out-dir DIR     # needs a CUDA device; writes DIR/gpu_collectives.{json,png}
    python bench/gpu_collectives.py --out-dir DIR --plot RUN1.json RUN2.json   # one plot of several runs

- np=1, NCCL: hvdlite's in-place allreduce of 1 MB, 64 MB and 1 GB float32 CUDA tensors against torch.distributed's
  NCCL backend at one rank. Both are local at one rank, so the ratio shows the overhead of each path. Also the
  enqueue-to-completion time of a 4-byte allreduce.
- np=2, two ranks on the same GPU: hvdlite stages through page-locked host memory and its host data plane (NCCL
  refuses two ranks on one GPU); torch.distributed's gloo backend with CUDA tensors also stages through host
  memory. 1 MB and 64 MB, as bus bandwidth (bytes / time at two ranks, as nccl-tests counts it).

Every operation is timed from submission to completion on the device (a synchronous hvdlite call; torch's call
followed by torch.cuda.synchronize), on rank 0. hvdlite and torch take turns in blocks (--rounds of each), and a
figure is the median over all the timed operations of one peer; ratios are torch's time over hvdlite's (above 1:
hvdlite is faster). The --role flag is internal: the np=2 part runs this file under hvdlite's launcher.
--dry-run-on-cpu runs the same script on CPU tensors with gloo, to check it where there is no GPU.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

MB = 1 << 20
NP1_SIZES = [(MB, 50), (64 * MB, 20), (1024 * MB, 5)]  # (bytes, operations per block)
NP2_SIZES = [(MB, 50), (64 * MB, 10)]
TINY_OPS = 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_op(fn, count, sync):
    """Seconds of each of count operations, each waited for."""
    times = []
    for _ in range(count):
        began = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - began)
    return times


def alternate(peers, count, rounds, sync, barrier=lambda: None):
    """{peer: [seconds per op]}: the peers take turns, `rounds` blocks of `count` operations each after a warm-up."""
    for fn in peers.values():
        per_op(fn, 3, sync)
    times = {name: [] for name in peers}
    for _ in range(rounds):
        for name, fn in peers.items():
            barrier()
            times[name] += per_op(fn, count, sync)
    return times


def summary(times, size):
    median = {name: statistics.median(t) for name, t in times.items()}
    row = {"bytes": size, **{f"{name}_us": m * 1e6 for name, m in median.items()}}
    row["ratio"] = median["torch"] / median["hvdlite"]
    return row


def on_device(dry_run):
    """(device, sync, torch's backend at np=1)."""
    import torch

    if dry_run:
        return "cpu", lambda: None, "gloo"
    torch.cuda.set_device(0)
    return "cuda", torch.cuda.synchronize, "nccl"


def run_np1(rounds, dry_run):
    import torch
    import torch.distributed as dist

    import hvdlite.torch as hvd

    hvd.init()
    device, sync, backend = on_device(dry_run)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    rows = []
    for size, count in NP1_SIZES:
        t = torch.ones(size // 4, device=device)
        peers = {
            "hvdlite": lambda t=t: hvd.allreduce_(t, op=hvd.Sum, name=f"np1.{t.numel()}"),
            "torch": lambda t=t: dist.all_reduce(t),
        }
        rows.append({"case": "np1-nccl-allreduce", **summary(alternate(peers, count, rounds, sync), size)})
        del t, peers
        if not dry_run:
            torch.cuda.empty_cache()
    tiny = torch.ones(1, device=device)
    peers = {
        "hvdlite": lambda: hvd.allreduce_(tiny, op=hvd.Sum, name="np1.tiny"),
        "torch": lambda: dist.all_reduce(tiny),
    }
    rows.append({"case": "np1-nccl-4-byte-latency", **summary(alternate(peers, TINY_OPS, rounds, sync), 4)})
    dist.destroy_process_group()
    hvd.shutdown()
    return rows


def run_np2(rounds, port, out, dry_run):
    import torch
    import torch.distributed as dist

    import hvdlite.torch as hvd

    hvd.init()
    device, sync, _ = on_device(dry_run)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size())
    rows = []
    for size, count in NP2_SIZES:
        t = torch.ones(size // 4, device=device)
        peers = {
            "hvdlite": lambda t=t: hvd.allreduce_(t, op=hvd.Sum, name=f"np2.{t.numel()}"),
            "torch": lambda t=t: dist.all_reduce(t),
        }
        times = alternate(peers, count, rounds, sync, barrier=dist.barrier)
        row = {"case": "np2-shared-gpu-allreduce", **summary(times, size)}
        for name in peers:
            row[f"{name}_busbw_GBps"] = size / (row[f"{name}_us"] * 1e-6) / 1e9
        rows.append(row)
    if hvd.rank() == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(rows, f)
    dist.destroy_process_group()
    hvd.shutdown()


def label(row):
    size = row["bytes"]
    text = f"{size // MB} MB" if size >= MB else f"{size} B"
    return {"np1-nccl-allreduce": f"np=1 NCCL\n{text}", "np1-nccl-4-byte-latency": "np=1 NCCL\n4 B latency"}.get(
        row["case"], f"np=2 one GPU\n{text}"
    )


def plot(runs, path):
    """torch's time over hvdlite's for every case, one bar per run (above 1: hvdlite faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = runs[0]["rows"]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / len(runs)
    for k, run in enumerate(runs):
        ratios = [r["ratio"] for r in run["rows"]]
        ax.bar([i + k * width for i in range(len(rows))], ratios, width, label=f"run {k + 1}", color=f"C{k}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks([i + width * (len(runs) - 1) / 2 for i in range(len(rows))], [label(r) for r in rows], fontsize=8)
    ax.set_ylabel("torch time / hvdlite time")
    m = runs[0]["machine"]
    ax.set_title(f"{m['device']}, torch {m['torch']}, NCCL {m['nccl']}: against torch.distributed", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--role", choices=["np2"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dry-run-on-cpu", action="store_true")
    parser.add_argument("--plot", nargs="+", metavar="JSON", help="only draw DIR/gpu_collectives.png from runs' JSON")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.plot:
        runs = []
        for path in args.plot:
            with open(path, encoding="utf-8") as f:
                runs.append(json.load(f))
        plot(runs, os.path.join(args.out_dir, "gpu_collectives.png"))
        return
    np2_file = os.path.join(args.out_dir, "np2.json")
    if args.role == "np2":
        run_np2(args.rounds, args.port, np2_file, args.dry_run_on_cpu)
        return
    import torch

    rows = run_np1(args.rounds, args.dry_run_on_cpu)
    command = [sys.executable, "-m", "hvdlite.runner.launch", "-np", "2", sys.executable, os.path.abspath(__file__)]
    command += ["--role", "np2", "--port", str(free_port()), "--rounds", str(args.rounds), "--out-dir", args.out_dir]
    command += ["--dry-run-on-cpu"] if args.dry_run_on_cpu else []
    subprocess.run(command, check=True, timeout=600)
    with open(np2_file, encoding="utf-8") as f:
        rows += json.load(f)
    os.remove(np2_file)
    gpu = not args.dry_run_on_cpu
    machine = {
        "device": torch.cuda.get_device_name(0) if gpu else "CPU (dry run)",
        "torch": torch.__version__,
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()) if gpu else "-",
        "cpus": os.cpu_count(),
    }
    with open(os.path.join(args.out_dir, "gpu_collectives.json"), "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "rows": rows}, f, indent=1)
    try:
        plot([{"machine": machine, "rows": rows}], os.path.join(args.out_dir, "gpu_collectives.png"))
    except ImportError:
        print("no matplotlib: no plot")
    print(f"{machine['device']}, torch {machine['torch']}, NCCL {machine['nccl']}, {machine['cpus']} CPUs")
    print("| case | bytes | hvdlite µs | torch µs | torch/hvdlite | hvdlite GB/s | torch GB/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        bw = f"{r['hvdlite_busbw_GBps']:.2f} | {r['torch_busbw_GBps']:.2f}" if "hvdlite_busbw_GBps" in r else " | "
        print(
            f"| {r['case']} | {r['bytes']} | {r['hvdlite_us']:.1f} | {r['torch_us']:.1f} | {r['ratio']:.2f} | {bw} |"
        )


if __name__ == "__main__":
    main()
