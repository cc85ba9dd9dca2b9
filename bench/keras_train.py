"""Keras 3 training throughput: a small conv net on synthetic 32x32x3 images, SGD with momentum, batch 32 per
process, one intra-op and one inter-op TensorFlow thread per process, model.fit on a repeated tf.data batch.
In one run: a single process, two independent single processes at once (no communication: the ceiling that
2 processes reach on this machine, where they share cores, caches and memory bandwidth), the same two processes
in lockstep (after every step each sends one byte to the other over a local socket and waits for the other's:
they exchange no gradients, so this is what any synchronous data-parallel library could at best reach), hvdlite
(hvdlite.tensorflow.keras.DistributedOptimizer) on 2 ranks, and TensorFlow's MultiWorkerMirroredStrategy on 2
workers (TF_CONFIG on localhost, global batch 64 split 32 + 32). Reports images/second, scaling efficiency =
(2-process img/s) / (2 x single img/s), and hvdlite / MWMS.

    python bench/keras_train.py [--steps 200] [--warmup 10] [--rounds 2] [--batch 32]

Runs are interleaved over --rounds (single, pair, mwms, hvdlite, single, ...) so that load changes on a shared
machine hit every configuration alike. Each figure is taken within a round; the report gives the median and the
worst round (and the best) and every round's figures (bench/rounds.py). A second, small measurement times the
bridge itself (see overhead_worker).

MultiWorkerMirroredStrategy does not run Keras 3's fit unpatched (keras-team/keras#20585,
tensorflow/tensorflow#72388); `_patch_keras_for_multi_worker` applies the two smallest fixes that make it run,
in the MWMS workers only:
  1. Trainer._maybe_symbolic_build reduces the first batch with strategy.reduce("MEAN", axis=None), which
     fails on a multi-worker PerReplica; it only needs one replica's batch to build the model.
  2. reduce_per_replica reduces scalar metrics with strategy.reduce("MEAN", v, axis=0), which fails on 0-d
     values; axis=None averages them over the workers as intended.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lockstep  # noqa: E402
import results_file  # noqa: E402
from rounds import ratio_by_round, summarize  # noqa: E402

ROOT = os.path.dirname(HERE)
KINDS = ("single", "pair", "lockstep", "mwms", "hvdlite")


def _configure_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def build_model(keras):
    layers = keras.layers
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ]
    )


def _patch_keras_for_multi_worker(tf):
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tree.map_structure(
                    lambda x: (
                        self.distribute_strategy.experimental_local_results(x)[0]
                        if isinstance(x, tf.distribute.DistributedValues)
                        else x
                    ),
                    batch,
                )
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = reduce_per_replica


def worker(kind, warmup, steps, batch, out):
    tf = _configure_tf()
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    rank, size = 0, 1
    waits = []  # the lockstep callback runs in every fit, the warm-up and the timed one
    if kind == "mwms":
        _patch_keras_for_multi_worker(tf)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        size = strategy.num_replicas_in_sync
        with strategy.scope():
            model = build_model(keras)
            model.compile(
                optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        global_batch = batch * size
        x = rng.random((global_batch, 32, 32, 3), dtype=np.float32)
        y = rng.integers(0, 10, global_batch)
        dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
        callbacks = []
    else:
        model = build_model(keras)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        callbacks = []
        if kind == "lockstep":
            waits = [_Lockstep(keras)]
            callbacks = waits
        if kind == "hvdlite":
            import hvdlite.tensorflow.keras as hvd

            hvd.init()
            rank, size = hvd.rank(), hvd.size()
            optimizer = hvd.DistributedOptimizer(optimizer)
            callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x = rng.random((batch, 32, 32, 3), dtype=np.float32)
        y = rng.integers(0, 10, batch)
        dataset = tf.data.Dataset.from_tensors((x, y)).repeat()

    model.fit(dataset, steps_per_epoch=warmup, epochs=1, verbose=0, callbacks=callbacks)
    window = _TrainingWindow(keras)
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[window] + waits)
    fit_seconds = time.perf_counter() - start
    seconds = window.end - window.begin
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    "kind": kind,
                    "ranks": size,
                    "seconds": seconds,
                    "fit_seconds": fit_seconds,
                    "steps": steps,
                    "batch_per_rank": batch,
                    "img_per_s": size * batch * steps / seconds,
                },
                f,
            )


def _Lockstep(keras):
    """A callback that waits for the other lockstep process after every training step (bench/lockstep.py)."""
    wait_for_peer = lockstep.peer_barrier()

    class Lockstep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            wait_for_peer()

    return Lockstep()


def _TrainingWindow(keras):
    """A callback that times fit's steps: from on_train_begin to on_train_end. Left out is what follows
    on_train_end, the teardown of fit's tf.data iterator, which with tf.data's autotuning (on by default) waits
    for the autotuner's thread to wake and takes anywhere from 0 to about 2.5 s per fit call, in any process,
    with or without a distribution library. Timing the whole call made the figures bimodal."""

    class TrainingWindow(keras.callbacks.Callback):
        begin = end = None

        def on_train_begin(self, logs=None):
            self.begin = time.perf_counter()

        def on_train_end(self, logs=None):
            self.end = time.perf_counter()

    return TrainingWindow()


def overhead_worker(out, steps=1000, rounds=5):
    """Per-step cost of the bridge: a tf.function train step (tiny model, no tf.data) with plain SGD against
    the same step with DistributedOptimizer(SGD), one rank: concat, enqueue, negotiation, wait, split, and the
    numpy_function round trip, but no data moved between processes. Interleaved rounds, best of each."""
    tf = _configure_tf()
    import keras
    import numpy as np

    import hvdlite.tensorflow.keras as hvd

    hvd.init()
    x = tf.constant(np.random.default_rng(0).random((8, 64), dtype=np.float32))
    y = tf.zeros([8], tf.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    steps_fns = {}
    for name in ("plain", "hvdlite"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
        )
        optimizer = keras.optimizers.SGD(0.01)
        if name == "hvdlite":
            optimizer = hvd.DistributedOptimizer(optimizer)

        def step(model=model, optimizer=optimizer):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        steps_fns[name] = tf.function(step)
        for _ in range(100):
            steps_fns[name]()
    best = {}
    for _ in range(rounds):
        for name, fn in steps_fns.items():
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            per_step = (time.perf_counter() - start) / steps * 1e6
            best[name] = min(best.get(name, float("inf")), per_step)
    with open(out, "w") as f:
        json.dump(
            {
                "plain_us_per_step": best["plain"],
                "hvdlite_us_per_step": best["hvdlite"],
                "overhead_us_per_step": best["hvdlite"] - best["plain"],
                "steps": steps,
                "rounds": rounds,
            },
            f,
        )


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch(kind, args, out):
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    me = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        kind,
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--batch",
        str(args.batch),
        "--out",
        out,
    ]
    if kind in ("single", "overhead"):
        return subprocess.run(me, env=env, timeout=1800).returncode
    if kind in ("pair", "lockstep"):  # two single processes at once, independent or waiting for each other
        if kind == "pair":
            me[me.index("--worker") + 1] = "single"
        envs = lockstep.environments(env)
        procs = [subprocess.Popen(me[:-1] + [f"{out}.{i}"], env=envs[i]) for i in range(2)]
        code = max(p.wait(timeout=1800) for p in procs)
        if code == 0:
            results = []
            for i in range(2):
                with open(f"{out}.{i}") as f:
                    results.append(json.load(f))
                os.remove(f"{out}.{i}")
            with open(out, "w") as f:
                json.dump(
                    {
                        "kind": kind,
                        "ranks": 2,
                        "seconds": max(r["seconds"] for r in results),
                        "fit_seconds": max(r["fit_seconds"] for r in results),
                        "steps": args.steps,
                        "batch_per_rank": args.batch,
                        "img_per_s": sum(r["img_per_s"] for r in results),
                    },
                    f,
                )
        return code
    if kind == "hvdlite":
        return subprocess.run(
            [sys.executable, "-m", "hvdlite.runner.local", "-np", "2", "--"] + me, env=env, timeout=1800
        ).returncode
    ports = _free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = [
        subprocess.Popen(
            me, env=dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
        )
        for i in range(2)
    ]
    return max(p.wait(timeout=1800) for p in procs)


def figures(rounds, overhead, args):
    """What a run keeps (bench/results_file.py): every round, and the figures taken from them."""
    return {
        "rounds": rounds,
        "summary": summarize(rounds, KINDS, ceiling="pair"),
        "hvdlite_over_mwms": ratio_by_round(rounds, "hvdlite", "mwms"),
        "hvdlite_over_lockstep": ratio_by_round(rounds, "hvdlite", "lockstep"),
        "overhead": overhead,
        "args": {k: v for k, v in vars(args).items() if k in ("steps", "warmup", "rounds", "batch")},
    }


def headline(data):
    """One line for the summary of docs/benchmarks.md: the median round, the worst in brackets."""
    hvdlite = data["summary"]["hvdlite"]
    return (
        f"{hvdlite['efficiency']['median']:.1%} scaling ({hvdlite['efficiency']['worst']:.1%}), "
        f"{results_file.times(data['hvdlite_over_mwms'])} MultiWorkerMirroredStrategy"
    )


def render(data):
    """The table of a run (bench/results_file.py)."""
    rounds, overhead, args = data["rounds"], data["overhead"], argparse.Namespace(**data["args"])
    summary, versus_mwms, versus_lockstep = data["summary"], data["hvdlite_over_mwms"], data["hvdlite_over_lockstep"]
    labels = {
        "single": "single process",
        "pair": "2 independent single processes at once (no communication: this machine's ceiling)",
        "lockstep": "the same 2 processes waiting for each other after every step (no gradients exchanged)",
        "mwms": "MultiWorkerMirroredStrategy, 2 workers (patched, see script)",
        "hvdlite": "hvdlite DistributedOptimizer, 2 ranks",
    }

    def cell(kind, figure, form):
        if figure not in summary[kind]:
            return "-"
        values, unit = summary[kind][figure], "x" if figure == "of_ceiling" else ""
        return f"{values['median']:{form}}{unit} ({values['worst']:{form}}{unit})"

    lines = [
        f"Keras 3 model.fit, small conv net (32x32x3, batch {args.batch} per process, SGD momentum), "
        f"{args.steps} timed steps after {args.warmup} warm-up steps, 1 TF thread per process, "
        f"{args.rounds} interleaved rounds. Each figure is taken within a round (against the single process and the "
        "ceiling of the same round), then the median and the worst round are given.",
        "",
        "| configuration | img/s, median (worst - best) | scaling efficiency, median (worst) | "
        "/ the ceiling, median (worst) |",
        "|---|---|---|---|",
    ]
    for kind in KINDS:
        speed = summary[kind]["img_per_s"]
        lines.append(
            f"| {labels[kind]} | {speed['median']:.1f} ({speed['worst']:.1f} - {speed['best']:.1f}) | "
            f"{cell(kind, 'efficiency', '.1%')} | {cell(kind, 'of_ceiling', '.2f')} |"
        )
    lines += [
        "",
        f"hvdlite / MultiWorkerMirroredStrategy img/s: median {versus_mwms['median']:.2f}x, worst "
        f"{versus_mwms['worst']:.2f}x",
        "",
        f"hvdlite / the lockstep processes img/s: median {versus_lockstep['median']:.2f}x, worst "
        f"{versus_lockstep['worst']:.2f}x",
        "",
        "Within each round (same load for every configuration): "
        + "; ".join(
            f"round {r + 1}: hvdlite efficiency {summary['hvdlite']['efficiency']['rounds'][r]:.1%}, "
            f"lockstep {summary['lockstep']['efficiency']['rounds'][r]:.1%}, "
            f"MWMS {summary['mwms']['efficiency']['rounds'][r]:.1%}, hvdlite / MWMS {versus_mwms['rounds'][r]:.2f}x"
            for r in range(len(versus_mwms["rounds"]))
        ),
        "",
        "All rounds (img/s): " + ", ".join(f"{x['kind']} {x['img_per_s']:.1f}" for x in rounds),
        "",
        "Not timed: fit's end, where TensorFlow tears down the tf.data iterator (see _TrainingWindow); it took "
        + ", ".join(f"{x['fit_seconds'] - x['seconds']:.2f}" for x in rounds)
        + " s in the runs above, in the same order.",
        "",
        f"Bridge overhead (1 rank, tf.function train step of a 64-32-10 MLP, batch 8, best of "
        f"{overhead['rounds']} x {overhead['steps']} steps): plain SGD {overhead['plain_us_per_step']:.0f} us/step, "
        f"DistributedOptimizer {overhead['hvdlite_us_per_step']:.0f} us/step, difference "
        f"{overhead['overhead_us_per_step']:.0f} us/step.",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker == "overhead":
        overhead_worker(args.out)
        return
    if args.worker:
        worker(args.worker, args.warmup, args.steps, args.batch, args.out)
        return
    os.makedirs(args.out_dir, exist_ok=True)
    rounds = []
    for r in range(args.rounds):
        for kind in KINDS:
            path = os.path.join(args.out_dir, f".raw-keras-{kind}.json")
            print(f"round {r + 1}: {kind} ...", flush=True)
            if launch(kind, args, path) != 0:
                raise SystemExit(f"{kind} run failed")
            with open(path) as f:
                rounds.append(dict(json.load(f), round=r + 1))
            os.remove(path)
    path = os.path.join(args.out_dir, ".raw-keras-overhead.json")
    print("bridge overhead ...", flush=True)
    if launch("overhead", args, path) != 0:
        raise SystemExit("overhead run failed")
    with open(path) as f:
        overhead = json.load(f)
    os.remove(path)

    results_file.save(args.out_dir, "keras_train", figures(rounds, overhead, args), render)


if __name__ == "__main__":
    main()
