"""Training throughput: ResNet-50 (25.6M parameters), synthetic 3x64x64 images, batch 8 per rank, SGD with
momentum, one intra-op thread per rank. In one run: a single process, torch DDP (gloo) on 2 ranks, and hvdlite
on 2 ranks. Reports images/second and scaling efficiency = (2-rank img/s) / (2 x single img/s).

    python bench/train.py [--steps 20] [--warmup 5] [--rounds 2]

Runs are interleaved over --rounds (single, ddp, hvdlite, single, ...) so that load changes on a shared machine
hit every configuration alike; the best round of each configuration is reported, and every round is recorded.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))


def build(seed=0):
    import torch
    from models import resnet50

    torch.manual_seed(seed)
    model = resnet50()
    data = torch.randn(8, 3, 64, 64)
    target = torch.randint(0, 1000, (8,))
    return model, data, target


def timed_loop(step, warmup, steps, sync=lambda: None):
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return time.perf_counter() - start


def worker(kind, warmup, steps, out):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    model, data, target = build()
    if kind == "single":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        rank, size, sync = 0, 1, (lambda: None)
        net = model
    elif kind == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        net = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        sync = dist.barrier
    else:
        import hvdlite.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                             named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        net, sync = model, hvd.barrier

    def step():
        optimizer.zero_grad()
        F.cross_entropy(net(data), target).backward()
        optimizer.step()

    seconds = timed_loop(step, warmup, steps, sync)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"kind": kind, "ranks": size, "seconds": seconds, "steps": steps,
                       "img_per_s": size * 8 * steps / seconds}, f)
    if kind == "ddp":
        import torch.distributed as dist

        dist.destroy_process_group()


def launch(kind, warmup, steps, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    me = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--warmup", str(warmup), "--steps",
          str(steps), "--out", out]
    if kind == "single":
        return subprocess.run(me, env=env, timeout=1800).returncode
    if kind == "hvdlite":
        return subprocess.run([sys.executable, "-m", "hvdlite.runner.local", "-np", "2", "--"] + me, env=env,
                              timeout=1800).returncode
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 1000), WORLD_SIZE="2")
    procs = [subprocess.Popen(me, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(2)]
    return max(p.wait(timeout=1800) for p in procs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.warmup, args.steps, args.out)
        return
    os.makedirs(args.out_dir, exist_ok=True)
    rounds = []
    for r in range(args.rounds):
        for kind in ("single", "ddp", "hvdlite"):
            path = os.path.join(args.out_dir, f".raw-train-{kind}.json")
            print(f"round {r + 1}: {kind} ...", flush=True)
            if launch(kind, args.warmup, args.steps, path) != 0:
                raise SystemExit(f"{kind} run failed")
            with open(path) as f:
                rounds.append(json.load(f))
            os.remove(path)
    best = {k: max(x["img_per_s"] for x in rounds if x["kind"] == k) for k in ("single", "ddp", "hvdlite")}
    eff = {k: best[k] / (2 * best["single"]) for k in ("ddp", "hvdlite")}
    lines = [
        "| configuration | img/s (best round) | scaling efficiency |",
        "|---|---|---|",
        f"| single process, 1 thread | {best['single']:.2f} | - |",
        f"| torch DDP (gloo), 2 ranks | {best['ddp']:.2f} | {eff['ddp']:.1%} |",
        f"| hvdlite, 2 ranks | {best['hvdlite']:.2f} | {eff['hvdlite']:.1%} |",
        "",
        f"hvdlite / DDP img/s: {best['hvdlite'] / best['ddp']:.2f}x",
        "",
        "All rounds (img/s): " + ", ".join(f"{x['kind']} {x['img_per_s']:.2f}" for x in rounds),
    ]
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out_dir, "train.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out_dir, "train.json"), "w") as f:
        json.dump({"rounds": rounds, "best": best, "efficiency": eff}, f, indent=1)


if __name__ == "__main__":
    main()
