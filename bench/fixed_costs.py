"""Fixed costs: what one small operation and one more tensor cost, against Open MPI and torch.distributed, in one run.

    python bench/fixed_costs.py                      # 2 ranks, 3 interleaved rounds, writes bench/results/
    python bench/fixed_costs.py --np 4 --rounds 5
    python bench/fixed_costs.py --ks 16,256,4096 --rounds 1 --out-dir /tmp/quick    # a quick look

Each part but keras is one job that mpirun starts (--peers latency,curve,optimizer,keras-hvdlite), in
which hvdlite and its peers (and, in the curve, every K) take turns in blocks of calls or steps: a call of a few
microseconds moves with the machine's state from second to second, so only figures timed in the same seconds
compare. The jobs take turns too,
and the whole turn repeats --rounds times. Every figure is the median over iterations within a run; the tables give
the median and the worst round, and ratios are taken within a round.

- latency: one float32 sum allreduce of 8 B and of 1 KB, repeated. hvdlite through hvdlite.torch's allreduce_ with
  a named tensor (in place, as a metric averaged every step: hvdlite) and its allreduce (into a new tensor each
  call: hvdlite-out), Open MPI through mpi4py's in-place Allreduce.
- per tensor: K named tensors of 1 KB each, averaged as a DistributedOptimizer step averages gradients:
  allreduce_async_ on each, then synchronize on each (hvdlite-async); the same K tensors as one
  grouped_allreduce_ (hvdlite-grouped); and
  the same bytes already fused into one tensor, one torch.distributed gloo allreduce (gloo-fused), the floor a
  framework that fuses before the call pays. Beside them two floors. Exchanging nothing, the least any
  collective per tensor does on each rank (touch-floor): a Python call per tensor that checks its cached facts and
  reads its address, as allreduce_async_'s steady state did in Python, then one pass that reads every tensor's
  1 KB into a flat buffer. And the least an allreduce of the separate tensors does with nothing kept per tensor
  (exchange-floor): the same call per tensor, then every tensor copied into a segment all ranks map, each rank
  averaging its share of the elements, and the result copied back, the ranks meeting at counters in that segment.
  How the floors grow with K is what the machine makes of the tensors and the caller's objects; what the
  collective grows beyond the exchange floor is its own state per tensor. The figure is the step's time divided by
  K: flat when the cost per tensor does not grow with the number of tensors in flight.
- optimizer: a training step (forward, backward, SGD step) of a model of K parameters of 256 floats each, whose
  computation is tiny, so the step is mostly the exchange's fixed costs: hvd.DistributedOptimizer (opt-hvdlite)
  against DistributedDataParallel over gloo (opt-ddp), and the plain model and optimizer (no exchange) timed
  first in the same job, to give what each exchange adds per parameter. Then the same on a small GPT-style
  transformer (--gpt-layers blocks, 16 parameter tensors each, 0 to leave it out).
- keras: Keras 3 model.fit on a stack of Dense(16) layers with V variables (--keras-variables), one TensorFlow
  thread per process: the step with hvdlite.tensorflow.keras.DistributedOptimizer minus the same step with the
  plain optimizer, in the same job (keras-hvdlite). Beside it, the same fit with a plain optimizer whose step
  passes the gradients, concatenated as hvdlite fuses them, through one tf.numpy_function that only meets the other
  ranks at a counter in shared memory: what synchronizing the ranks once a step costs by itself on this machine,
  with no data exchanged and no library involved, the floor of any synchronous data-parallel step. Then the same
  three for a custom training loop (one tf.function a step) whose gradients come from
  hvdlite.tensorflow.DistributedGradientTape, a plain tf.GradientTape, and a plain one met at the barrier.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import results_file  # noqa: E402
from allreduce import available, pyplot  # noqa: E402

KS = [16, 64, 128, 256, 1024, 4096, 16384]
LATENCY_BYTES = [8, 1024]
TENSOR_FLOATS = 256  # 1 KB of float32 per tensor
OPTIMIZER_KS = [256, 1024, 4096]
LATENCY_PEERS = ["hvdlite", "hvdlite-out", "mpi"]
LATENCY_BLOCKS = 10  # turns of each call a size, after as many untimed calls as a turn makes
LATENCY_BLOCK_ITERATIONS = 2000
CURVE_PEERS = ["hvdlite-async", "hvdlite-grouped", "gloo-fused", "touch-floor", "exchange-floor"]
# The curve's floors: each one's column in the table and its short name.
FLOORS = {
    "touch-floor": ("each tensor touched, nothing exchanged (the touch floor)", "touch floor"),
    "exchange-floor": (
        "each tensor touched and averaged through shared memory, no records (the exchange floor)",
        "exchange floor",
    ),
}
OPTIMIZER_PEERS = ["opt-hvdlite", "opt-ddp"]
LATENCY_JOB, CURVE_JOB, OPTIMIZER_JOB = "latency", "curve", "optimizer"
# Jobs that mpirun starts, each timing its peers (the columns) in the same processes, taking turns.
JOB_COLUMNS = {LATENCY_JOB: LATENCY_PEERS, CURVE_JOB: CURVE_PEERS, OPTIMIZER_JOB: OPTIMIZER_PEERS}
KERAS_PEERS = ["keras-hvdlite"]
KERAS_VARIABLES = [10, 100, 400]
GPT_LAYERS = 16  # 16 parameter tensors a block: 261 tensors in all


CURVE_BLOCKS = 5


def steps_for(k):
    """Steps timed for K tensors (after 3 warm-up steps): about 40,000 tensors in all, and at least 25 steps, so
    that each of the 5 blocks holds 5. With fewer, a large K's median was a block's first step, which meets the
    caches as the other peers' blocks left them, while a small K's was a step that followed its own."""
    return max(25, min(400, 40000 // k))


def take_turns(calls, barrier, blocks, per_block, warmup=3):
    """{name: median seconds of one call} for calls {name: fn}: warmup untimed calls of each, then blocks turns in
    which each makes per_block timed calls (a number, or {name: number}), the order rotating each turn, so that all
    of them meet the machine's state of the same seconds."""
    order = list(calls)
    for name in order:
        for _ in range(warmup):
            calls[name]()
    times = {name: [] for name in order}
    for block in range(blocks):
        for name in order[block % len(order) :] + order[: block % len(order)]:
            fn, timed = calls[name], times[name]
            barrier()
            for _ in range(per_block[name] if isinstance(per_block, dict) else per_block):
                start = time.perf_counter()
                fn()
                timed.append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def time_steps(step, barrier, steps):
    """Median seconds of step() over steps calls, after 3 untimed."""
    return take_turns({"step": step}, barrier, 1, steps)["step"]


def latency_worker():
    """hvdlite (in place and into a new tensor) and Open MPI through mpi4py, in the same two processes started by
    mpirun: across separate jobs the machine's state moved the figures by up to 2x, within one job both meet it."""
    import numpy as np
    import torch
    from mpi4py import MPI

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    results = {peer: [] for peer in LATENCY_PEERS}
    for nbytes in LATENCY_BYTES:
        tensor = torch.ones(max(1, nbytes // 4))
        array = np.ones(max(1, nbytes // 4), dtype=np.float32)
        calls = {
            "hvdlite": lambda: hvd.allreduce_(tensor, name="latency", op=hvd.Sum),
            "hvdlite-out": lambda: hvd.allreduce(tensor, name="latency", op=hvd.Sum),
            "mpi": lambda: comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM),
        }
        medians = take_turns(calls, comm.Barrier, LATENCY_BLOCKS, LATENCY_BLOCK_ITERATIONS, LATENCY_BLOCK_ITERATIONS)
        for peer, seconds in medians.items():
            results[peer].append({"bytes": nbytes, "seconds": seconds})
    return hvd.rank(), hvd.size(), results


def worker(peer, ks):
    if peer in KERAS_PEERS:
        return keras_worker()
    if peer == LATENCY_JOB:
        return latency_worker()
    if peer == OPTIMIZER_JOB:
        return optimizer_worker()
    if peer == CURVE_JOB:
        return curve_worker(ks)
    raise SystemExit(f"unknown peer {peer!r}")


def curve_worker(ks):
    """{peer: [{k, seconds a step}]} for CURVE_PEERS in one job that mpirun starts, each peer on tensors of its own.
    Every K and every peer take turns in blocks of steps: the growth from one K to another is a ratio too, and the
    machine's pace moved by more than it between the minutes that K after K would take."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, size, hvd = init_both()
    exchange = SharedExchange(rank, size, max(ks) * TENSOR_FLOATS, hvd)
    steps, per_block, kept = {}, {}, {}
    for k in ks:
        for peer in CURVE_PEERS:
            per_block[peer, k] = max(1, steps_for(k) // CURVE_BLOCKS)
            if peer == "gloo-fused":
                flat = torch.ones(k * TENSOR_FLOATS)
                steps[peer, k] = lambda flat=flat: dist.all_reduce(flat)
                continue
            tensors = [torch.ones(TENSOR_FLOATS) for _ in range(k)]
            names = [f"k{k}.{peer}.{i}" for i in range(k)]
            kept[peer, k] = tensors
            if peer == "hvdlite-async":

                def step(tensors=tensors, names=names):
                    handles = [hvd.allreduce_async_(t, name=n) for t, n in zip(tensors, names)]
                    for h in handles:
                        hvd.synchronize(h)

            elif peer == "touch-floor":
                step = touch_floor_step(tensors, names)
            elif peer == "exchange-floor":
                step = exchange_floor_step(exchange, tensors, names)
            else:

                def step(tensors=tensors, k=k):
                    hvd.grouped_allreduce_(tensors, name=f"k{k}.group")

            steps[peer, k] = step
    medians = take_turns(steps, hvd.barrier, CURVE_BLOCKS, per_block)
    results = {peer: [{"k": k, "seconds": medians[peer, k]} for k in ks] for peer in CURVE_PEERS}
    for (peer, k), tensors in kept.items():
        if not all(bool((t == 1.0).all()) for t in (tensors[0], tensors[-1])):  # the average of equal values
            raise SystemExit(f"{peer}: K={k} averaged ones into {tensors[0][:4].tolist()}")
    dist.destroy_process_group()
    exchange.close()
    return rank, size, results


def checked_address(tensors, names, peer):
    """touch(tensor, name): the tensor's address, after comparing it with the facts cached under its name."""
    facts = {name: (tensor.dtype, tensor.shape) for tensor, name in zip(tensors, names)}

    def touch(tensor, name):
        known = facts[name]
        if known[0] is tensor.dtype and known[1] == tensor.shape and tensor.is_cpu and tensor.is_contiguous():
            return tensor.data_ptr()
        raise SystemExit(f"{peer}: {name} changed")

    return touch


class SharedExchange:
    """A segment that every rank of the job maps: a line of its own for each rank's meeting counter, an area of
    most_floats for each rank's tensors, and one for the result. The exchange floor's bytes cross the ranks here
    with nothing kept per tensor: no name, request, entry or handle."""

    def __init__(self, rank, size, most_floats, hvd):
        import mmap
        import tempfile

        import numpy as np
        import torch

        self.rank, self.size, self.epoch = rank, size, 0
        line, area = 64, most_floats * 4
        length = line * size + area * (size + 1)
        # A container's /dev/shm may be smaller than the segment (64 MB by default), and a page beyond its limit
        # kills the process that touches it; a file elsewhere is shared through the page cache all the same.
        folder = tempfile.gettempdir()
        if os.path.isdir("/dev/shm"):
            shm = os.statvfs("/dev/shm")
            if shm.f_bavail * shm.f_frsize > 2 * length:
                folder = "/dev/shm"
        path = hvd.broadcast_object(
            os.path.join(folder, f"hvdlite-bench-exchange-{os.getpid()}") if rank == 0 else None
        )
        if rank == 0:
            with open(path, "wb") as f:
                f.truncate(length)
        hvd.barrier()
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), length)
        hvd.barrier()
        if rank == 0:
            os.unlink(path)  # the mappings stay
        self._words = np.frombuffer(self._map, dtype=np.uint64, count=line * size // 8)
        self._stride = line // 8
        self.areas = [
            torch.frombuffer(self._map, dtype=torch.float32, count=most_floats, offset=line * size + i * area)
            for i in range(size + 1)
        ]

    def meet(self):
        """Returns once every rank has called meet as often as this one: each writes its own counter and reads the
        others' (an aligned word, so no rank sees it half written). A waiting rank yields its core, which more ranks
        than cores need."""
        self.epoch += 1
        words, stride, epoch = self._words, self._stride, self.epoch
        words[self.rank * stride] = epoch
        for other in range(self.size):
            while words[other * stride] < epoch:
                os.sched_yield()

    def close(self):
        self.areas, self._words = [], None


def exchange_floor_step(exchange, tensors, names):
    """A step of the least an allreduce of separate tensors does across the ranks of one host, with nothing kept per
    tensor beyond the caller's own facts: touch-floor's call per tensor, then one pass that copies every tensor into
    this rank's area of a shared segment, a meeting, each rank averaging its share of the elements over every rank's
    area into the result area, a meeting, and one pass that copies the whole result back into the tensors. (The next
    step's first meeting keeps any rank from overwriting what another still reads.)"""
    import torch

    from hvdlite.common import ops

    touch = checked_address(tensors, names, "exchange-floor")
    sizes = ops.ffi.new("int64_t[]", [TENSOR_FLOATS * 4] * len(tensors))
    total, rank, size = len(tensors) * TENSOR_FLOATS, exchange.rank, exchange.size
    mine, result = exchange.areas[rank], exchange.areas[size]
    low, high = total * rank // size, total * (rank + 1) // size
    shares, share_out = [area[low:high] for area in exchange.areas[:size]], result[low:high]

    def average():
        if size == 2:
            torch.lerp(shares[0], shares[1], 0.5, out=share_out)
            return
        torch.add(shares[0], shares[1], out=share_out)
        for share in shares[2:]:
            share_out.add_(share)
        share_out.mul_(1.0 / size)

    def step(stagger=0.0):
        addresses = ops.address_array([touch(t, n) for t, n in zip(tensors, names)])
        if stagger:  # the check below: each rank later than the one before, into each meeting
            time.sleep(stagger * rank)
        ops.gather_bytes(mine.data_ptr(), addresses, sizes)
        exchange.meet()
        if stagger:
            time.sleep(stagger * rank)
        average()
        exchange.meet()
        ops.scatter_bytes(result.data_ptr(), addresses, sizes)

    # Checked once, the ranks reaching each meeting some milliseconds apart, on values that differ by rank, by
    # tensor and from the last check's: a step that skipped a meeting or the exchange would leave some wrong.
    shift = exchange.epoch
    for i, tensor in enumerate(tensors):
        tensor.fill_(rank + (i + shift) % 7)
    step(stagger=0.02)
    expected = [(size - 1) / 2 + (i + shift) % 7 for i in range(len(tensors))]
    wrong = [i for i, tensor in enumerate(tensors) if not bool((tensor == expected[i]).all())]
    if wrong:
        raise SystemExit(f"exchange-floor: K={len(tensors)}, tensor {wrong[0]} averaged to {tensors[wrong[0]][:2]}")
    for tensor in tensors:
        tensor.fill_(1.0)
    return step


def touch_floor_step(tensors, names):
    """A step of the least a collective per tensor does on its own rank: a call per tensor that finds its cached
    facts by name, compares them and reads the tensor's address (allreduce_async_'s steady state as it was in
    Python, without the core; it now runs in C, without a frame), then one pass in the core that reads each
    tensor's data into a flat buffer. Nothing is exchanged."""
    import torch

    from hvdlite.common import ops

    touch = checked_address(tensors, names, "touch-floor")
    flat = torch.empty(len(tensors) * TENSOR_FLOATS)
    sizes = ops.ffi.new("int64_t[]", [TENSOR_FLOATS * 4] * len(tensors))

    def step():
        addresses = [touch(t, n) for t, n in zip(tensors, names)]
        ops.gather_bytes(flat.data_ptr(), addresses, sizes)

    return step


class ManyParameters:
    """A model of k parameters of TENSOR_FLOATS floats whose forward is one product and sum per parameter."""

    @staticmethod
    def build(k):
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weights = torch.nn.ParameterList(
                    torch.nn.Parameter(torch.randn(TENSOR_FLOATS)) for _ in range(k)
                )

            def forward(self, x):
                return torch.stack([(w * x).sum() for w in self.weights]).sum()

        torch.manual_seed(0)
        return Model()


class GPT:
    """A small GPT-style decoder (token and position embeddings, pre-norm blocks of causal self-attention with
    separate q, k, v and output projections and a 4x MLP, final norm, untied head): many parameter tensors of
    the shapes a transformer has, at a size two CPU ranks train in milliseconds."""

    VOCAB, CONTEXT, WIDTH, HEADS, BATCH = 256, 32, 64, 4, 8

    @staticmethod
    def batch(rank):
        """(input tokens, next-token targets flattened): this rank's batch for next-token prediction."""
        import torch

        tokens = torch.randint(
            0, GPT.VOCAB, (GPT.BATCH, GPT.CONTEXT + 1), generator=torch.Generator().manual_seed(rank)
        )
        return tokens[:, :-1], tokens[:, 1:].reshape(-1)

    @staticmethod
    def build(layers):
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self, width, heads):
                super().__init__()
                self.heads = heads
                self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
                self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))
                self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

            def forward(self, x):
                b, t, c = x.shape
                h = self.norm1(x)
                q, k, v = (
                    p(h).view(b, t, self.heads, c // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v)
                )
                attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.out(attended.transpose(1, 2).reshape(b, t, c))
                return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.tokens = nn.Embedding(GPT.VOCAB, GPT.WIDTH)
                self.positions = nn.Embedding(GPT.CONTEXT, GPT.WIDTH)
                self.blocks = nn.Sequential(*(Block(GPT.WIDTH, GPT.HEADS) for _ in range(layers)))
                self.norm = nn.LayerNorm(GPT.WIDTH)
                self.head = nn.Linear(GPT.WIDTH, GPT.VOCAB, bias=False)

            def forward(self, idx):
                x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
                return self.head(self.norm(self.blocks(x)))

        torch.manual_seed(0)
        return Model()


def keras_worker():
    """Per-step time of Keras model.fit with and without hvdlite's DistributedOptimizer, and of a custom training
    loop with and without DistributedGradientTape, by variable count."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import hvdlite.tensorflow as hvd_tf
    import hvdlite.tensorflow.keras as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    warmup, steps, batch, turns = 20, 100, 8, 4

    class StepClock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch_index, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch_index, logs=None):
            if batch_index >= warmup:
                self.times.append(time.perf_counter() - self.started)

    def fit_run(model):
        def run(times):
            clock = StepClock()
            clock.times = times
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[clock])

        return run

    rng = np.random.default_rng(hvd.rank())
    x = rng.random((steps + warmup) * batch * 16, dtype=np.float32).reshape(-1, 16)
    y = rng.random(x.shape, dtype=np.float32)
    barrier = SharedCounterBarrier(hvd)

    def met_at_barrier(grads):
        """The gradients, concatenated as hvdlite fuses them, through the bare barrier and split back."""
        grads = list(grads)
        fused = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
        fused = tf.numpy_function(barrier, [fused], [fused.dtype], stateful=True)[0]
        pieces = tf.split(fused, [g.shape.num_elements() for g in grads])
        return [tf.reshape(p, g.shape) for p, g in zip(pieces, grads)]

    class BarrierSGD(keras.optimizers.SGD):
        def apply(self, grads, trainable_variables=None):
            return super().apply(met_at_barrier(grads), trainable_variables)

    optimizers = {
        "local": lambda: keras.optimizers.SGD(0.001),
        "barrier": lambda: BarrierSGD(0.001),
        "distributed": lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)),
    }
    # A custom training loop's step, one tf.function call: the gradients of a plain tape, of
    # hvdlite.tensorflow.DistributedGradientTape, or of a plain tape met at the bare barrier.
    tapes = {
        "tape_local": lambda tape: tape,
        "tape_barrier": lambda tape: tape,
        "tape_distributed": hvd_tf.DistributedGradientTape,
    }
    batches = [
        (tf.constant(x[i * batch : (i + 1) * batch]), tf.constant(y[i * batch : (i + 1) * batch]))
        for i in range(steps + warmup)
    ]

    def custom_loop(model, wrap, met):
        optimizer = keras.optimizers.SGD(0.001)

        @tf.function
        def step(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(features) - labels))
            tape = wrap(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(met(grads) if met else grads, model.trainable_variables)

        def run(times):
            for index, (features, labels) in enumerate(batches):
                started = time.perf_counter()
                step(features, labels)
                if index >= warmup:
                    times.append(time.perf_counter() - started)

        return run

    results = []
    for variables in (int(v) for v in os.environ["HVDLITE_BENCH_KERAS_VARIABLES"].split(",")):
        runs, times = {}, {}
        for variant in list(optimizers) + list(tapes):
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((16,))] + [keras.layers.Dense(16) for _ in range(variables // 2)])
            times[variant] = []
            if variant in optimizers:
                model.compile(optimizers[variant](), "mse")
                runs[variant] = fit_run(model)
            else:
                runs[variant] = custom_loop(model, tapes[variant], met_at_barrier if "barrier" in variant else None)
        # The variants take turns, several times: the machine's slow spells (seconds long) hit each alike.
        for _ in range(turns):
            for variant, run in runs.items():
                hvd.barrier()
                run(times[variant])
        timed = {variant: statistics.median(t) for variant, t in times.items()}
        results.append({"variables": len(model.trainable_variables), **timed})
    return hvd.rank(), hvd.size(), results


class SharedCounterBarrier:
    """Meets the job's ranks (one host) at a counter array in shared memory, yielding the CPU while it waits: the
    cheapest way to keep ranks in step, with no data and no library in between. Called with an array, returns it."""

    def __init__(self, hvd):
        import numpy as np

        directory = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
        path = hvd.broadcast_object(os.path.join(directory, f"hvdlite-bench-barrier-{os.getpid()}"), 0)
        if hvd.rank() == 0:
            np.zeros(hvd.size() * 8, np.int64).tofile(path)  # one 64-byte line per rank
        hvd.barrier()
        self.counts = np.memmap(path, dtype=np.int64, mode="r+", shape=(hvd.size() * 8,))
        hvd.barrier()
        if hvd.rank() == 0:
            os.unlink(path)  # the mappings stay
        self.mine = hvd.rank() * 8
        self.everyone = self.counts[::8]

    def __call__(self, array):
        self.counts[self.mine] += 1
        arrived = self.counts[self.mine]
        while self.everyone.min() < arrived:
            os.sched_yield()
        return array


def init_peer(ddp: bool):
    """(rank, size, barrier, hvdlite.torch or None) for a worker of torch.distributed over gloo or of hvdlite."""
    if ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size(), dist.barrier, None
    import hvdlite.torch as hvd

    hvd.init()
    return hvd.rank(), hvd.size(), hvd.barrier, hvd


def init_both():
    """(rank, size, hvdlite.torch) with torch.distributed's gloo group up beside hvdlite, in a job mpirun started:
    DistributedOptimizer and DDP then take turns within the same processes."""
    import torch.distributed as dist
    from mpi4py import MPI

    import hvdlite.torch as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    port = comm.bcast(29500 + os.getpid() % 1000 if comm.Get_rank() == 0 else None, root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(), world_size=comm.Get_size()
    )
    return hvd.rank(), hvd.size(), hvd


def exchange_step_times(build, loss, hvd, steps, floor=None):
    """{peer: median seconds of an SGD step} of build()'s model on loss(model): without any exchange ("local"),
    then hvd.DistributedOptimizer's step (opt-hvdlite) and DDP's over gloo (opt-ddp), "distributed", in blocks that
    take turns, so that both meet the machine's state of the same seconds. The local steps run first, by
    themselves: in turns with distributed ones, they would also pay for the libraries' activity between steps,
    which belongs to the exchange. floor (a SharedCounterBarrier): also the plain step meeting the other ranks
    there between backward and the update ("barrier", under opt-hvdlite), the least any synchronous exchange adds."""
    import torch

    def stepper(variant):
        model = build()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
        if variant == "opt-ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        elif variant == "opt-hvdlite":
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

        def step():
            optimizer.zero_grad()
            loss(model).backward()
            if variant == "barrier":
                floor(None)
            optimizer.step()

        return step

    variants = ("local", "barrier") if floor else ("local",)
    local = {variant: time_steps(stepper(variant), hvd.barrier, steps) for variant in variants}
    turns = {peer: stepper(peer) for peer in OPTIMIZER_PEERS}
    distributed = take_turns(turns, hvd.barrier, 5, max(3, steps // 5))
    out = {peer: {"local": local["local"], "distributed": distributed[peer]} for peer in OPTIMIZER_PEERS}
    if floor:
        out["opt-hvdlite"]["barrier"] = local["barrier"]
    return out


def optimizer_worker():
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    ks = [int(k) for k in os.environ["HVDLITE_BENCH_OPTIMIZER_KS"].split(",")]
    rank, size, hvd = init_both()
    x = torch.randn(TENSOR_FLOATS)
    results = {peer: [] for peer in OPTIMIZER_PEERS}
    for k in ks:
        timed = exchange_step_times(
            lambda: ManyParameters.build(k), lambda model: model(x), hvd, max(25, min(100, 20000 // k))
        )
        for peer in OPTIMIZER_PEERS:
            results[peer].append({"k": k, **timed[peer]})
    layers = int(os.environ.get("HVDLITE_BENCH_GPT_LAYERS", GPT_LAYERS))
    if layers:
        inputs, targets = GPT.batch(rank)

        def loss(model):
            return torch.nn.functional.cross_entropy(model(inputs).reshape(-1, GPT.VOCAB), targets)

        timed = exchange_step_times(lambda: GPT.build(layers), loss, hvd, 20, SharedCounterBarrier(hvd))
        tensors = sum(1 for _ in GPT.build(layers).parameters())
        for peer in OPTIMIZER_PEERS:
            results[peer].append({"model": "gpt", "layers": layers, "tensors": tensors, **timed[peer]})
    dist.destroy_process_group()
    return rank, size, results


def launch(peer, np_, out_path, ks, script=None):
    """Runs peer's worker (this file's, or script's) as an np_-process job: hvdlite's launcher, mpirun, or
    torch.distributed's environment variables."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        HVDLITE_BENCH_KS=",".join(str(k) for k in ks),
        HVDLITE_BENCH_OPTIMIZER_KS=os.environ.get("HVDLITE_BENCH_OPTIMIZER_KS", ",".join(map(str, OPTIMIZER_KS))),
        HVDLITE_BENCH_KERAS_VARIABLES=os.environ.get(
            "HVDLITE_BENCH_KERAS_VARIABLES", ",".join(map(str, KERAS_VARIABLES))
        ),
    )
    me = [sys.executable, script or os.path.abspath(__file__), "--worker", peer, "--out", out_path]
    if peer not in JOB_COLUMNS and "hvdlite" in peer:
        cmd = [sys.executable, "-m", "hvdlite.runner.local", "-np", str(np_), "--"] + me
        return subprocess.run(cmd, env=env, timeout=1800).returncode
    if peer in JOB_COLUMNS:
        extra = ["--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else []
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = ["mpirun", "-np", str(np_), "--bind-to", "none"] + extra + me
        return subprocess.run(cmd, env=env, timeout=1800).returncode
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), WORLD_SIZE=str(np_))
    procs = [subprocess.Popen(me, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(np_)]
    return max(p.wait(timeout=1800) for p in procs)


def run_rounds(peers, rounds_n, np_, out_dir, ks, script=None):
    """[{peer: rank 0's results}] for each round, the peers taking turns within it."""
    rounds = []
    for turn in range(rounds_n):
        this_round = {}
        for peer in peers:
            out_path = os.path.join(out_dir, f".raw-{os.path.basename(script or __file__)}-{peer}.json")
            print(f"round {turn + 1}/{rounds_n}: running {peer} ...", flush=True)
            rc = launch(peer, np_, out_path, ks, script=script)
            if rc != 0:
                raise SystemExit(f"{peer} run failed with exit code {rc}")
            with open(out_path) as f:
                results = json.load(f)
            if peer in JOB_COLUMNS:  # one job, a column per peer it timed
                this_round.update(results)
            else:
                this_round[peer] = results
            os.remove(out_path)
        rounds.append(this_round)
    return rounds


def spread(values):
    return {"median": statistics.median(values), "worst": max(values), "rounds": list(values)}


def ratio_spread(values):
    """Ratios where higher is better for hvdlite: median and the worst (lowest) round."""
    return {"median": statistics.median(values), "worst": min(values), "rounds": list(values)}


def paired_ratio(rounds, over, under, seconds):
    """ratio_spread of seconds(round[over]) / seconds(round[under]) over the rounds that ran both (None if none)."""
    paired = [rd for rd in rounds if over in rd and under in rd]
    return ratio_spread([seconds(rd[over]) / seconds(rd[under]) for rd in paired]) if paired else None


def summarize(rounds, ks):
    """rounds: [{peer: results}] in round order -> the report's figures (every ratio within its round)."""
    out = {"latency": [], "per_tensor": [], "linearity": {}, "optimizer": [], "transformer": None, "keras": []}
    ran = {peer for rd in rounds for peer in rd}
    for nbytes in LATENCY_BYTES if ran & set(LATENCY_PEERS) else ():
        row = {"bytes": nbytes}
        for peer in LATENCY_PEERS:
            values = [next(r["seconds"] for r in rd[peer] if r["bytes"] == nbytes) for rd in rounds if peer in rd]
            if values:
                row[peer] = spread(values)
        for over, key in (("hvdlite", "mpi_over_hvdlite"), ("hvdlite-out", "mpi_over_hvdlite_out")):
            ratio = paired_ratio(
                rounds, "mpi", over, lambda rs: next(r["seconds"] for r in rs if r["bytes"] == nbytes)
            )
            if ratio:
                row[key] = ratio
        out["latency"].append(row)

    def step_seconds(rd, peer, k):
        return next(r["seconds"] for r in rd[peer] if r["k"] == k)

    for k in ks if ran & set(CURVE_PEERS) else ():
        row = {"k": k}
        for peer in CURVE_PEERS:
            values = [step_seconds(rd, peer, k) / k for rd in rounds if peer in rd]
            if values:
                row[peer] = spread(values)
        for under, key in (
            ("hvdlite-async", "gloo_fused_over_async"),
            ("hvdlite-grouped", "gloo_fused_over_grouped"),
        ):
            ratio = paired_ratio(
                rounds, "gloo-fused", under, lambda rs: next(r["seconds"] for r in rs if r["k"] == k)
            )
            if ratio:
                row[key] = ratio
        out["per_tensor"].append(row)
    optimizer_ks = sorted({r["k"] for rd in rounds for peer in OPTIMIZER_PEERS for r in rd.get(peer, []) if "k" in r})
    for k in optimizer_ks:
        row = {"k": k}
        for peer in OPTIMIZER_PEERS:
            runs = [next(r for r in rd[peer] if r.get("k") == k) for rd in rounds if peer in rd]
            if runs:
                row[peer] = {
                    "step": spread([r["distributed"] for r in runs]),
                    "added_per_parameter": spread([(r["distributed"] - r["local"]) / k for r in runs]),
                }
        ratio = paired_ratio(
            rounds, "opt-ddp", "opt-hvdlite", lambda rs: next(r["distributed"] for r in rs if r.get("k") == k)
        )
        if ratio:
            row["ddp_over_hvdlite"] = ratio
        out["optimizer"].append(row)
    gpt = {}
    for peer in OPTIMIZER_PEERS:
        runs = [r for rd in rounds for r in rd.get(peer, []) if r.get("model") == "gpt"]
        if runs:
            gpt.update(layers=runs[0]["layers"], tensors=runs[0]["tensors"])
            gpt[peer] = {
                "step": spread([r["distributed"] for r in runs]),
                "added": spread([r["distributed"] - r["local"] for r in runs]),
            }
            if all("barrier" in r for r in runs):
                gpt[peer]["barrier_added"] = spread([r["barrier"] - r["local"] for r in runs])
    if gpt:
        ratio = paired_ratio(
            rounds, "opt-ddp", "opt-hvdlite", lambda rs: next(r["distributed"] for r in rs if r.get("model") == "gpt")
        )
        if ratio:
            gpt["ddp_over_hvdlite"] = ratio
        out["transformer"] = gpt
    keras_runs = [rd["keras-hvdlite"] for rd in rounds if "keras-hvdlite" in rd]
    for variables in sorted({r["variables"] for runs in keras_runs for r in runs}):
        runs = [next(r for r in rs if r["variables"] == variables) for rs in keras_runs]
        row = {"variables": variables}
        # model.fit with DistributedOptimizer (no prefix); a custom loop with DistributedGradientTape ("tape_").
        for prefix in ("", "tape_"):
            local, distributed, barrier = prefix + "local", prefix + "distributed", prefix + "barrier"
            if not all(distributed in r for r in runs):
                continue
            row[local] = spread([r[local] for r in runs])
            row[distributed] = spread([r[distributed] for r in runs])
            row[prefix + "added"] = spread([r[distributed] - r[local] for r in runs])
            if all(barrier in r for r in runs):
                row[prefix + "barrier_added"] = spread([r[barrier] - r[local] for r in runs])
        out["keras"].append(row)
    # Per-tensor cost at each K over that at the smallest K of at least 128, within each round: 1.0 is linear.
    base = next((k for k in ks if k >= 128), ks[0])
    for peer in ["hvdlite-async", "hvdlite-grouped", *FLOORS]:
        present = [rd for rd in rounds if peer in rd]
        if not present:
            continue
        out["linearity"][peer] = {
            "base_k": base,
            "by_k": {
                str(k): spread(
                    [step_seconds(rd, peer, k) / k / (step_seconds(rd, peer, base) / base) for rd in present]
                )
                for k in ks
            },
        }
    return out


def _cell(spread_, scale=1.0, digits=2, suffix=""):
    if not spread_:
        return "-"
    return f"{spread_['median'] * scale:.{digits}f}{suffix} ({spread_['worst'] * scale:.{digits}f}{suffix})"


def report_lines(summary):
    """The report's tables, one per part that ran."""
    lines = []
    if summary["latency"]:
        lines += [
            "",
            "| allreduce | hvdlite, in place (us) | hvdlite, into a new tensor (us) | Open MPI (us) | "
            "MPI time / hvdlite time, in place | into a new tensor |",
            "|---|---|---|---|---|---|",
        ]
        out_of_place = any("hvdlite-out" in row for row in summary["latency"])
        if not out_of_place:  # results kept from before hvdlite-out ran
            lines[-2:] = [
                "| allreduce | hvdlite (us) | Open MPI (us) | MPI time / hvdlite time |",
                "|---|---|---|---|",
            ]
        for row in summary["latency"]:
            peers = LATENCY_PEERS if out_of_place else ["hvdlite", "mpi"]
            ratios = ["mpi_over_hvdlite", "mpi_over_hvdlite_out"] if out_of_place else ["mpi_over_hvdlite"]
            cells = [f"{row['bytes']} B"] + [_cell(row.get(peer), 1e6) for peer in peers]
            cells += [_cell(row.get(key), suffix="x") for key in ratios]
            lines.append("| " + " | ".join(cells) + " |")
    if summary["per_tensor"]:
        linearity = summary["linearity"].get("hvdlite-async", {})
        # Floors absent from results kept from before they ran get no columns.
        floors = [peer for peer in FLOORS if peer in summary["linearity"]]
        peers = [peer for peer in CURVE_PEERS if peer not in FLOORS or peer in floors]
        base = linearity.get("base_k", "-")
        header = (
            "| K tensors of 1 KB | hvdlite async + synchronize, us a tensor | hvdlite grouped, us a tensor | "
            "gloo, one fused allreduce, us a tensor | "
            + "".join(f"{FLOORS[peer][0]}, us a tensor | " for peer in floors)
            + f"gloo time / hvdlite async time | gloo time / hvdlite grouped time | async per tensor / at K={base} |"
            + "".join(f" {FLOORS[peer][1]} per tensor / at K={base} |" for peer in floors)
        )
        lines += ["", header, "|---" * header.count(" | ") + "|---|"]
        for row in summary["per_tensor"]:
            cells = [str(row["k"])] + [_cell(row.get(peer), 1e6) for peer in peers]
            cells.append(_cell(row.get("gloo_fused_over_async"), suffix="x"))
            cells.append(_cell(row.get("gloo_fused_over_grouped"), suffix="x"))
            cells.append(_cell(linearity.get("by_k", {}).get(str(row["k"]))))
            for peer in floors:
                cells.append(_cell(summary["linearity"][peer]["by_k"].get(str(row["k"]))))
            lines.append("| " + " | ".join(cells) + " |")
    if summary["optimizer"]:
        lines += [
            "",
            "| parameters of 1 KB | DistributedOptimizer step (ms) | DDP (gloo) step (ms) | "
            "DDP time / hvdlite time | added per parameter, hvdlite (us) | added per parameter, DDP (us) |",
            "|---|---|---|---|---|---|",
        ]
        for row in summary["optimizer"]:
            cells = [str(row["k"])]
            cells += [_cell(row.get(peer, {}).get("step"), 1e3) for peer in OPTIMIZER_PEERS]
            cells.append(_cell(row.get("ddp_over_hvdlite"), suffix="x"))
            cells += [_cell(row.get(peer, {}).get("added_per_parameter"), 1e6, 1) for peer in OPTIMIZER_PEERS]
            lines.append("| " + " | ".join(cells) + " |")
    gpt = summary.get("transformer")
    if gpt:
        lines += [
            "",
            f"| GPT-style transformer, {gpt['layers']} blocks, {gpt['tensors']} parameter tensors | "
            "DistributedOptimizer step (ms) | DDP (gloo) step (ms) | DDP time / hvdlite time | "
            "added by the exchange, hvdlite (ms) | added, DDP (ms) | "
            "added by a bare shared-memory barrier in the step, hvdlite's job (ms) |",
            "|---|---|---|---|---|---|---|",
        ]
        cells = ["training step"] + [_cell(gpt.get(peer, {}).get("step"), 1e3) for peer in OPTIMIZER_PEERS]
        cells.append(_cell(gpt.get("ddp_over_hvdlite"), suffix="x"))
        cells += [_cell(gpt.get(peer, {}).get("added"), 1e3) for peer in OPTIMIZER_PEERS]
        cells.append(_cell(gpt.get("opt-hvdlite", {}).get("barrier_added"), 1e3))
        lines.append("| " + " | ".join(cells) + " |")
    keras_tables = (
        ("", "Keras fit", "plain optimizer", "DistributedOptimizer"),
        ("tape_", "custom loop", "plain tf.GradientTape", "DistributedGradientTape"),
    )
    for prefix, what, plain, distributed in keras_tables:
        if not any(prefix + "added" in row for row in summary.get("keras") or []):
            continue
        lines += [
            "",
            f"| {what}, variables | {plain} step (ms) | {distributed} step (ms) | added by {distributed} (ms) | "
            "added by a bare shared-memory barrier in the step (ms) |",
            "|---|---|---|---|---|",
        ]
        for row in summary["keras"]:
            keys = (prefix + "local", prefix + "distributed", prefix + "added", prefix + "barrier_added")
            cells = [str(row["variables"])] + [_cell(row.get(key), 1e3, 3) for key in keys]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(data):
    """The tables of a run (bench/results_file.py)."""
    lines = [f"{data['np']} ranks, {data['rounds']} round(s) of every peer, interleaved"]
    lines += report_lines(data["summary"])
    lines += ["", "Each cell: median of the rounds (worst round); ratios are taken within a round."]
    return "\n".join(lines)


def headline(data):
    """One line for the summary of docs/benchmarks.md: the median round, the worst in brackets."""
    summary, parts = data["summary"], []
    optimizer = [row for row in summary["optimizer"] if "ddp_over_hvdlite" in row]
    if optimizer:
        parts.append(
            "`DistributedOptimizer` at "
            + ", ".join(f"{row['k']:,}" for row in optimizer)
            + " parameters of 1 KB: "
            + ", ".join(results_file.times(row["ddp_over_hvdlite"]) for row in optimizer)
            + " DDP's speed"
        )
    gpt = summary.get("transformer")
    if gpt and "ddp_over_hvdlite" in gpt:
        parts.append(
            f"a GPT-style transformer of {gpt['tensors']} tensors {results_file.times(gpt['ddp_over_hvdlite'])}"
        )
    keras = {row["variables"]: row for row in summary.get("keras") or []}
    if 100 in keras:
        added = f"Keras adds {keras[100]['added']['median'] * 1e3:.2f} ms a step at 100 variables"
        if "barrier_added" in keras[100]:
            added += f" (a bare barrier in the step {keras[100]['barrier_added']['median'] * 1e3:.2f} ms)"
        if "tape_added" in keras[100]:
            added += f", DistributedGradientTape {keras[100]['tape_added']['median'] * 1e3:.2f} ms"
        parts.append(added)
    linearity = summary["linearity"].get("hvdlite-async", {})
    if "4096" in linearity.get("by_k", {}):
        growth = (
            f"a collective per tensor costs {linearity['by_k']['4096']['median']:.2f}x as much at 4,096 tensors in "
            f"flight as at {linearity['base_k']:,}"
        )
        said = {
            "touch-floor": "touching each tensor alone, nothing exchanged",
            "exchange-floor": "touched and averaged through shared memory, no records",
        }
        floors = [
            f"{said[peer]}: {figure['median']:.2f}x"
            for peer in FLOORS
            if (figure := summary["linearity"].get(peer, {}).get("by_k", {}).get("4096"))
        ]
        if floors:
            growth += f" ({'; '.join(floors)})"
        parts.append(growth)
    grouped = next(
        (row for row in summary["per_tensor"] if row["k"] == 1024 and "gloo_fused_over_grouped" in row), None
    )
    if grouped:
        parts.append(
            f"`grouped_allreduce_` of 1,024 tensors at {results_file.times(grouped['gloo_fused_over_grouped'])} the "
            "speed of gloo's one allreduce of the same bytes"
        )
    small = next((row for row in summary["latency"] if "mpi_over_hvdlite" in row), None)
    if small:
        parts.append(f"{small['bytes']} B allreduce {results_file.times(small['mpi_over_hvdlite'])} Open MPI's speed")
    return f"{data['np']} ranks: " + "; ".join(parts)


def report(summary, rounds_n, np_, ks, out_dir):
    name = "fixed_costs" if np_ == 2 else f"fixed_costs_np{np_}"  # each job size its own
    stem = os.path.join(out_dir, name)
    results_file.save(out_dir, name, {"np": np_, "rounds": rounds_n, "ks": ks, "summary": summary}, render)
    plt = pyplot()
    if plt is None:
        return
    fig, (curve, against_ddp) = plt.subplots(1, 2, figsize=(12, 4.5))
    for peer in CURVE_PEERS:
        rows = [row for row in summary["per_tensor"] if peer in row]
        if rows:
            curve.plot([r["k"] for r in rows], [r[peer]["median"] * 1e6 for r in rows], marker="o", label=peer)
    curve.set_xlabel("tensors of 1 KB in one step (K)")
    curve.set_ylabel("median time per tensor (us)")
    curve.set_title("one collective per tensor, and its floors")
    rows = [row for row in summary["optimizer"] if "ddp_over_hvdlite" in row]
    if rows:
        ks_ = [r["k"] for r in rows]
        against_ddp.plot(ks_, [r["ddp_over_hvdlite"]["median"] for r in rows], marker="o", label="median round")
        against_ddp.plot(ks_, [r["ddp_over_hvdlite"]["worst"] for r in rows], marker="x", label="worst round")
        against_ddp.axhline(1.0, color="grey", linewidth=0.8)
    against_ddp.set_xlabel("parameters of 1 KB (K)")
    against_ddp.set_ylabel("DDP step time / DistributedOptimizer step time")
    against_ddp.set_title("training step against DDP (higher: hvdlite faster)")
    for ax in (curve, against_ddp):
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(f"fixed costs, {np_} ranks on one host")
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="turns of every peer, interleaved (default 3)")
    parser.add_argument("--ks", default=",".join(str(k) for k in KS), help="tensor counts, comma-separated")
    parser.add_argument(
        "--peers",
        default=",".join(list(JOB_COLUMNS) + KERAS_PEERS),
        help="which peers run (default: all available)",
    )
    parser.add_argument(
        "--optimizer-ks", default=",".join(map(str, OPTIMIZER_KS)), help="parameter counts of the optimizer part"
    )
    parser.add_argument(
        "--gpt-layers", type=int, default=GPT_LAYERS, help="blocks of the optimizer part's transformer (0: none)"
    )
    parser.add_argument(
        "--keras-variables",
        default=",".join(map(str, KERAS_VARIABLES)),
        help="variable counts of the Keras part's models",
    )
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        ks = [int(k) for k in os.environ["HVDLITE_BENCH_KS"].split(",")]
        rank, size, results = worker(args.worker, ks)
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump(results, f)
        return
    os.makedirs(args.out_dir, exist_ok=True)
    os.environ["HVDLITE_BENCH_OPTIMIZER_KS"] = args.optimizer_ks
    os.environ["HVDLITE_BENCH_GPT_LAYERS"] = str(args.gpt_layers)
    os.environ["HVDLITE_BENCH_KERAS_VARIABLES"] = args.keras_variables
    ks = [int(k) for k in args.ks.split(",")]
    peers = []
    for peer in args.peers.split(","):
        if available("mpi" if peer in JOB_COLUMNS else peer) and (
            peer not in KERAS_PEERS or importlib.util.find_spec("keras")
        ):
            peers.append(peer)
        else:
            needs = "mpi4py and mpirun" if peer in JOB_COLUMNS else "its library"
            print(f"skipping {peer}: {needs} not installed")
    rounds = run_rounds(peers, args.rounds, args.np, args.out_dir, ks)
    report(summarize(rounds, ks), args.rounds, args.np, ks, args.out_dir)


if __name__ == "__main__":
    main()
