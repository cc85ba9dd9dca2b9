"""Training over slow links: wall time to a test accuracy with gradient compression, local SGD and bounded
staleness against synchronous allreduce, on two network-namespace hosts whose links tc limits
(tests/netns_cluster.py; needs root).

    python bench/slow_links.py                                  # 2 hosts x 1 rank, 100mbit and 1gbit
    python bench/slow_links.py --per-host 2 --rates 100mbit     # 2 hosts x 2 ranks (adds the two-tier row)
    python bench/slow_links.py --methods sync,powersgd --steps 100 --out-dir /tmp/s   # a quick look
    python bench/slow_links.py --per-host 2 --methods sync,powersgd-16-trial --seeds 0,1,2,3,4   # five seeds

The task (bench/slow_links_task.py) is a generated CIFAR-like set and a 1.07M-parameter conv net (4.3 MB of
float32 gradients a step), batch 32 per rank, SGD with momentum and a cosine learning-rate decay to 0 over the run
(so that test accuracy settles instead of swinging a few points from one evaluation to the next). Every method
trains the same model from the same start on the same batches for --steps steps; every --eval-every steps each
rank's clock stops while rank 0 tests the model. Reported per method: the training seconds to first reach
--target test accuracy, the final accuracy, the median step, and the bytes host 0's link carried per step in both
directions (its veth counters, launch and set-up included). Methods:
  sync            hvdlite DistributedOptimizer, fp32 gradients, flat ring (HVDLITE_HIERARCHICAL_ALLREDUCE=0)
  sync-two-tier   the same through the two-tier allreduce (2 ranks per host and more)
  fp16            Compression.fp16
  powersgd        Compression.powersgd(rank=4, start_iter=10)
  powersgd-8      Compression.powersgd(rank=8, start_iter=10)
  powersgd-16     Compression.powersgd(rank=16, start_iter=10)
  powersgd-8-trial  rank 8 with min_step_speedup=1.25: compressing only if the last 8 uncompressed steps and the
                  first 8 compressed ones show compressed steps 1.25x shorter
  powersgd-16-trial  the same at rank 16
  powersgd-16-trial-rate-4  the same, compressing only matrices that rank 16 shrinks at least 4x
                  (min_compression_rate=4; the default 2 also compresses the 64 x 288 conv gradient)
  topk            Compression.topk(ratio=0.01, start_iter=10)
  topk-5          Compression.topk(ratio=0.05, start_iter=10)
  local-sgd       sync_every=8 after 16 synchronous steps, outer Nesterov step (outer_lr 0.7, momentum 0.5)
  stale-1         staleness=1: each step's allreduce runs during the next step (fp32, applied one step late)
  stale-2         staleness=2
  ddp-powersgd    torch DDP (gloo) with its PowerSGD communication hook at the same rank and start
  ddp-powersgd-16 the same at rank 16
  keras-sync, keras-powersgd-8, keras-powersgd-8-trial
                  the same net in Keras 3 through hvdlite.tensorflow.keras.DistributedOptimizer (a tf.function
                  step), synchronous and with PowerSGD as above
With --seeds, every method trains once per seed (the weights and the batch order change, the data set does not;
the order of the methods alternates from seed to seed), and the report adds, per method, its times against the
same seed's synchronous run and the median over the seeds. Writes slow_links.json, slow_links.md and
slow_links.png (accuracy against training seconds; with several seeds, the first seed's curves).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)
import results_file  # noqa: E402

METHODS = (
    "sync",
    "sync-two-tier",
    "fp16",
    "powersgd",
    "powersgd-8",
    "powersgd-16",
    "powersgd-8-trial",
    "powersgd-16-trial",
    "powersgd-16-trial-rate-4",
    "topk",
    "topk-5",
    "local-sgd",
    "stale-1",
    "stale-2",
    "ddp-powersgd",
    "ddp-powersgd-16",
    "keras-sync",
    "keras-powersgd-8",
    "keras-powersgd-8-trial",
)
POWERSGD_RANK = 4
START_ITER = 10
DDP_POWERSGD_RANKS = {"ddp-powersgd": POWERSGD_RANK, "ddp-powersgd-16": 4 * POWERSGD_RANK}


def optimizer_settings(method, hvd):
    method = method[len("keras-") :] if method.startswith("keras-") else method
    return {
        "sync": {},
        "sync-two-tier": {},
        "fp16": {"compression": hvd.Compression.fp16},
        "powersgd": {"compression": hvd.Compression.powersgd(rank=POWERSGD_RANK, start_iter=START_ITER)},
        "powersgd-8": {"compression": hvd.Compression.powersgd(rank=2 * POWERSGD_RANK, start_iter=START_ITER)},
        "powersgd-16": {"compression": hvd.Compression.powersgd(rank=4 * POWERSGD_RANK, start_iter=START_ITER)},
        "powersgd-8-trial": {
            "compression": hvd.Compression.powersgd(
                rank=2 * POWERSGD_RANK, start_iter=START_ITER, min_step_speedup=1.25, trial_steps=8
            )
        },
        "powersgd-16-trial": {
            "compression": hvd.Compression.powersgd(
                rank=4 * POWERSGD_RANK, start_iter=START_ITER, min_step_speedup=1.25, trial_steps=8
            )
        },
        "powersgd-16-trial-rate-4": {
            "compression": hvd.Compression.powersgd(
                rank=4 * POWERSGD_RANK,
                start_iter=START_ITER,
                min_compression_rate=4,
                min_step_speedup=1.25,
                trial_steps=8,
            )
        },
        "topk": {"compression": hvd.Compression.topk(ratio=0.01, start_iter=START_ITER)},
        "topk-5": {"compression": hvd.Compression.topk(ratio=0.05, start_iter=START_ITER)},
        "local-sgd": {"sync_every": 8, "sync_warmup_steps": 16, "outer_lr": 0.7, "outer_momentum": 0.5},
        "stale-1": {"staleness": 1},
        "stale-2": {"staleness": 2},
    }[method]


def batch_seed(seed, rank):
    """Each rank's batch order for a run seed (seed 0 keeps the order the figures before seeds were measured with)."""
    return 1000 * (seed + 1) + rank


def _host_interface():
    """This network namespace's link to the others (gloo must be told which interface to use)."""
    names = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    return names[0]


def keras_worker(args):
    import numpy as np
    import tensorflow as tf
    from slow_links_task import make_data, make_keras_model

    import hvdlite.tensorflow.keras as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    (train_x, train_y), (test_x, test_y) = make_data()
    train_x, test_x = train_x.transpose(0, 2, 3, 1).copy(), test_x.transpose(0, 2, 3, 1).copy()
    model = make_keras_model(args.seed)
    import keras

    base = keras.optimizers.SGD(args.lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(base, **optimizer_settings(args.method, hvd))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))

    rng = np.random.default_rng(batch_seed(args.seed, rank))
    clock, curve, steps = 0.0, [], []
    for step in range(1, args.steps + 1):
        optimizer.learning_rate.assign(args.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / args.steps)))
        start = time.perf_counter()
        index = rng.integers(0, len(train_x), args.batch)
        train_step(tf.constant(train_x[index]), tf.constant(train_y[index]))
        steps.append(time.perf_counter() - start)
        clock += steps[-1]
        if step % args.eval_every == 0:
            accuracy = 0.0
            if rank == 0:
                logits = model.predict(test_x, batch_size=512, verbose=0)
                accuracy = float((logits.argmax(1) == test_y).mean())
            curve.append([step, clock, accuracy])
            hvd.barrier()  # every rank's clock stays stopped while rank 0 tests
    if rank == 0:
        feedback = optimizer._hvd().feedback
        trial = feedback.trial.state() if feedback is not None and feedback.trial.min_step_speedup else None
        _write_result(args, size, curve, steps, clock, trial)


def _write_result(args, size, curve, steps, clock, trial):
    import numpy as np

    reached = next((seconds for _, seconds, accuracy in curve if accuracy >= args.target), None)
    with open(args.out, "w") as f:
        json.dump(
            {
                "method": args.method,
                "ranks": size,
                "curve": curve,
                "seconds_to_target": reached,
                "final_accuracy": curve[-1][2],
                "median_step_s": float(np.median(steps)),
                "train_seconds": clock,
                "compression_trial": trial,
            },
            f,
        )


def worker(args):
    if args.method.startswith("keras-"):
        keras_worker(args)
        return
    import torch
    import torch.nn.functional as F
    from slow_links_task import make_data, make_model

    import hvdlite.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    (train_x, train_y), (test_x, test_y) = make_data()
    train_x, train_y = torch.from_numpy(train_x), torch.from_numpy(train_y)
    test_x, test_y = torch.from_numpy(test_x), torch.from_numpy(test_y)
    model = make_model(args.seed)
    inner = None
    if args.method.startswith("ddp-powersgd"):
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        os.environ["GLOO_SOCKET_IFNAME"] = _host_interface()
        dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}", rank=rank, world_size=size)
        # One bucket: with several, the hook's chained allreduces can reach gloo in a different order on each
        # rank (seen here as "Received data size doesn't match expected size" and an abort).
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1024)
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=DDP_POWERSGD_RANKS[args.method],
            start_powerSGD_iter=START_ITER,
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        inner = model.module
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
            named_parameters=model.named_parameters(),
            **optimizer_settings(args.method, hvd),
        )
        inner = model
    generator = torch.Generator().manual_seed(batch_seed(args.seed, rank))
    clock, curve, steps = 0.0, [], []
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / args.steps))
        start = time.perf_counter()
        index = torch.randint(0, len(train_x), (args.batch,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(model(train_x[index]), train_y[index]).backward()
        optimizer.step()
        if step == args.steps and hasattr(optimizer, "drain"):
            optimizer.drain()  # bounded staleness: the last steps' averages, applied before the final test
        steps.append(time.perf_counter() - start)
        clock += steps[-1]
        if step % args.eval_every == 0:
            with torch.no_grad():
                accuracy = (inner(test_x).argmax(1) == test_y).float().mean().item() if rank == 0 else 0.0
            curve.append([step, clock, accuracy])
            hvd.barrier()  # every rank's clock stays stopped while rank 0 tests
    if rank == 0:
        _write_result(args, size, curve, steps, clock, trial_outcome(optimizer))


def trial_outcome(optimizer):
    """What a reducer's compression trial decided, and on which step times (None without a trial)."""
    reducer = getattr(optimizer, "gradient_reducer", None)
    if reducer is None or reducer.trial.min_step_speedup is None:
        return None
    return reducer.trial.state()


def link_bytes(cluster):
    """Bytes host 0's link has carried, both directions (read at the bridge's end of its veth pair)."""
    device = cluster.outside(0)
    total = 0
    for direction in ("rx_bytes", "tx_bytes"):
        with open(f"/sys/class/net/{device}/statistics/{direction}") as f:
            total += int(f.read())
    return total


def run_method(cluster, args, method, seed, out):
    a, b = cluster.hosts
    env = dict(
        os.environ,
        HVDLITE_HIERARCHICAL_ALLREDUCE="1" if method == "sync-two-tier" else "0",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(
            [ROOT, HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    launcher = os.path.join(os.path.dirname(sys.executable), "hvdlite-run")
    command = [
        launcher,
        "-np",
        str(2 * args.per_host),
        "-H",
        f"{a.address}:{args.per_host},{b.address}:{args.per_host}",
        *cluster.ssh_flags(),
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--method",
        method,
        "--steps",
        str(args.steps),
        "--eval-every",
        str(args.eval_every),
        "--batch",
        str(args.batch),
        "--lr",
        str(args.lr),
        "--target",
        str(args.target),
        "--seed",
        str(seed),
        "--master",
        a.address,
        "--port",
        str(29400 + os.getpid() % 500),
        "--out",
        out,
    ]
    before = link_bytes(cluster)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    carried = link_bytes(cluster) - before
    if result.returncode != 0:
        raise SystemExit(f"{method} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    with open(out) as f:
        report = json.load(f)
    report["link_bytes_per_step"] = carried / args.steps
    return report


def trial_summary(trial):
    """One line on what a compression trial measured and decided."""
    plain, waited = trial["plain_seconds"] * 1e3, trial.get("waited_seconds")
    steps = trial.get("compressed_steps")
    text = f"the trial's uncompressed steps took {plain:.1f} ms (median)"
    if waited is not None:
        text += f", {waited * 1e3:.1f} ms of it waiting for the exchange (each step's least wait over the ranks)"
    if trial.get("work_seconds") is not None:
        text += f"; a rehearsed compressed exchange of a step's gradients took {trial['work_seconds'] * 1e3:.1f} ms"
    if trial.get("compressed_seconds") is None:
        return text + "; not compressing, decided before any compressed step."
    text += f"; {steps} compressed step{'' if steps == 1 else 's'} took {trial['compressed_seconds'] * 1e3:.1f} ms"
    text += " (median); "
    return text + ("compressing." if trial["decision"] else "not compressing.")


def headline(data):
    """One line for the summary of docs/benchmarks.md: each method's time to target against synchronous training,
    the median over seeds and the range."""
    import numpy as np

    parts = []
    for rate, by_seed in data["results"].items():
        methods = next(iter(by_seed.values())).keys()
        for method in methods:
            if method in ("sync", "keras-sync"):
                continue
            ratios = []
            for rows in by_seed.values():
                base, reached = baseline_of(method, rows)["seconds_to_target"], rows[method]["seconds_to_target"]
                ratios.append(base / reached if base and reached else 0.0)
            parts.append(
                f"{method} at {rate} {np.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x over "
                f"{len(ratios)} seed{'s' if len(ratios) > 1 else ''})"
            )
    return "time to target against synchronous fp32: " + ", ".join(parts)


def render(data):
    """The tables of a run (bench/results_file.py)."""
    return report_table(data["results"], argparse.Namespace(**data["args"]))


def report_table(results, args):
    lines = [
        f"2 hosts x {args.per_host} rank(s), {args.steps} steps of batch {args.batch} per rank, target "
        f"{args.target:.0%} test accuracy; times are training seconds (evaluation excluded); keras- rows are "
        "compared with keras-sync.",
        "",
    ]
    for rate, by_seed in results.items():
        for seed, rows in by_seed.items():
            lines += method_rows(f"Link {rate}:" if len(by_seed) == 1 else f"Link {rate}, seed {seed}:", rows)
        if len(by_seed) > 1:
            lines += seed_summary(rate, by_seed)
    return "\n".join(lines)


def baseline_of(method, rows):
    """The synchronous row a method is compared with: each framework against its own."""
    return rows.get("keras-sync" if method.startswith("keras-") else "sync")


def method_rows(title, rows):
    lines = [
        title,
        "",
        "| method | seconds to target | vs sync fp32 | final accuracy | median step (ms) | link MB per step |",
        "|---|---|---|---|---|---|",
    ]
    for method, row in rows.items():
        reached = row["seconds_to_target"]
        baseline = (baseline_of(method, rows) or {}).get("seconds_to_target")
        speedup = f"{baseline / reached:.2f}x" if baseline and reached else "-"
        lines.append(
            f"| {method} | {'not reached' if reached is None else f'{reached:.1f}'} | {speedup} | "
            f"{row['final_accuracy']:.1%} | {row['median_step_s'] * 1e3:.1f} | "
            f"{row['link_bytes_per_step'] / 1e6:.2f} |"
        )
    for method, row in rows.items():
        trial = row.get("compression_trial")
        if trial and trial.get("decision") is not None:
            lines += ["", f"{method}: " + trial_summary(trial)]
    return lines + [""]


def seed_summary(rate, by_seed):
    """Per method, its time to target and final accuracy against synchronous training's, seed by seed."""
    import numpy as np

    lines = [
        f"Link {rate}, {len(by_seed)} seeds (seed by seed, then the median; final accuracy in points against the "
        "synchronous row of the same seed):",
        "",
        "| method | vs sync fp32, by seed | median | final accuracy minus sync's, by seed | mean |",
        "|---|---|---|---|---|",
    ]
    methods = next(iter(by_seed.values())).keys()
    for method in methods:
        if method in ("sync", "keras-sync"):
            continue
        ratios, gaps = [], []
        for rows in by_seed.values():
            row, baseline = rows[method], baseline_of(method, rows)
            if baseline is None:
                continue
            reached, base = row["seconds_to_target"], baseline["seconds_to_target"]
            ratios.append(base / reached if reached and base else None)
            gaps.append(100 * (row["final_accuracy"] - baseline["final_accuracy"]))
        if not gaps:
            continue
        known = [r for r in ratios if r is not None]
        lines.append(
            f"| {method} | {', '.join('-' if r is None else f'{r:.2f}x' for r in ratios)} | "
            f"{f'{np.median(known):.2f}x' if len(known) == len(ratios) else '-'} | "
            f"{', '.join(f'{g:+.1f}' for g in gaps)} | {np.mean(gaps):+.2f} |"
        )
    return lines + [""]


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for axis, (rate, by_seed) in zip(axes[0], results.items()):
        seed, rows = next(iter(by_seed.items()))  # the first seed's curves
        for method, row in rows.items():
            curve = row["curve"]
            axis.plot([c[1] for c in curve], [c[2] for c in curve], label=method, marker=".")
        axis.set_title(f"link {rate}" if len(by_seed) == 1 else f"link {rate}, seed {seed}")
        axis.set_xlabel("training seconds")
        axis.set_ylabel("test accuracy")
        axis.set_xscale("log")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="100mbit,1gbit", help="link rates in tc's units, comma-separated")
    parser.add_argument("--per-host", type=int, default=1)
    parser.add_argument("--methods", default=None, help="comma-separated (default: all that apply)")
    parser.add_argument("--steps", type=int, default=320)
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument(
        "--seeds", default="0", help="comma-separated run seeds (weights and batch order; the data set stays)"
    )
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--method")
    parser.add_argument("--master")
    parser.add_argument("--port", type=int)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from netns_cluster import ClusterUnavailable, start_cluster

    methods = (
        args.methods.split(",") if args.methods else [m for m in METHODS if m != "sync-two-tier" or args.per_host > 1]
    )
    os.makedirs(args.out_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="hvdlite-bench-slow-")
    try:
        cluster = start_cluster(workdir, count=2)
    except ClusterUnavailable as exc:
        raise SystemExit(f"bench/slow_links.py: cannot create the test hosts: {exc}")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    results = {}
    try:
        for rate in args.rates.split(","):
            for index in range(2):
                cluster.limit_rate(index, rate)
            results[rate] = {}
            for number, seed in enumerate(seeds):
                results[rate][seed] = {}
                # So that no method always runs first (or second) in a series, the order alternates from seed to seed.
                for method in methods if number % 2 == 0 else methods[::-1]:
                    row = run_method(cluster, args, method, seed, os.path.join(workdir, f"{method}.json"))
                    results[rate][seed][method] = row
                    print(
                        f"{rate} seed {seed} {method}: to target {row['seconds_to_target']} s, "
                        f"final {row['final_accuracy']:.3f}, step {row['median_step_s'] * 1e3:.1f} ms, "
                        f"{row['link_bytes_per_step'] / 1e6:.2f} MB/step",
                        flush=True,
                    )
                results[rate][seed] = {method: results[rate][seed][method] for method in methods}
    finally:
        cluster.stop()
    data = {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "out")}, "results": results}
    results_file.save(args.out_dir, "slow_links", data, render)
    plot(results, os.path.join(args.out_dir, "slow_links.png"))


if __name__ == "__main__":
    main()
