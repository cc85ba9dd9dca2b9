"""PowerSGD and top-k compression with error feedback for the Keras DistributedOptimizer, as hvdlite.torch's
gradient_reducers do for PyTorch (the same algorithms, settings and state; see that module for the method).

`Compression.powersgd(...)` and `Compression.topk(...)` return a spec; the optimizer builds one ErrorFeedback
from it. Each update hands every gradient to one stateful `tf.numpy_function`, whose body runs the whole
exchange on numpy arrays: the gradients compression would not shrink go out as one allreduce per dtype, started
first so that the core fuses and runs it while the others are compressed; PowerSGD then allreduces all P in one
buffer and all Q in another, top-k allgathers (index, value) pairs. What a rank did not send stays in its
residual for the next update. With `min_step_speedup`, a trial over the last uncompressed updates and the first
compressed ones decides whether compressing pays on this job's links (hvdlite/common/compression_trial.py); its
compressed updates are timed but apply the exact average, so a trial that decides against compressing costs no
progress. The state lives outside TensorFlow's tracking (nothing of it is saved with the model);
TensorFlowKerasState commits and restores it.
"""

import copy
import math
import time
import zlib
from typing import Dict, List

import numpy as np
import tensorflow as tf

from hvdlite.common import ops, slow_link_settings
from hvdlite.common.basics import OP_ALLGATHER, OP_ALLREDUCE, timeline_counter
from hvdlite.common.compression_trial import CompressionTrial
from hvdlite.common.ops import Average, Min, Sum
from hvdlite.tensorflow import bridge


class ErrorFeedbackSpec:
    """What Compression.powersgd(...) / Compression.topk(...) return for Keras: the kind and its settings."""

    def __init__(self, kind: str, **settings):
        self.kind = kind
        self.settings = settings
        _ErrorFeedback.for_kind(kind)(prefix="", op=Average, process_set=None, **settings)  # bad settings fail now

    def build(self, prefix: str, op, process_set) -> "_ErrorFeedback":
        return _ErrorFeedback.for_kind(self.kind)(prefix=prefix, op=op, process_set=process_set, **self.settings)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return f"Compression.{self.kind}({args})"


def powersgd(
    rank: int = 1,
    start_iter: int = 10,
    min_compression_rate: float = 2,
    warm_start: bool = True,
    seed: int = 0,
    min_step_speedup=None,
    trial_steps: int = 8,
) -> ErrorFeedbackSpec:
    """PowerSGD compression with error feedback; `rank` is the approximation's rank. min_step_speedup: compress
    only if the last trial_steps uncompressed updates and the first trial_steps compressed ones show the compressed
    this many times shorter (None: always)."""
    return ErrorFeedbackSpec(
        "powersgd",
        rank=rank,
        start_iter=start_iter,
        min_compression_rate=min_compression_rate,
        warm_start=warm_start,
        seed=seed,
        min_step_speedup=min_step_speedup,
        trial_steps=trial_steps,
    )


def topk(
    ratio: float = 0.01,
    start_iter: int = 10,
    min_compression_rate: float = 2,
    min_step_speedup=None,
    trial_steps: int = 8,
) -> ErrorFeedbackSpec:
    """Top-k sparsification with error feedback; `ratio` of each gradient's entries is sent. min_step_speedup and
    trial_steps as for powersgd."""
    return ErrorFeedbackSpec(
        "topk",
        ratio=ratio,
        start_iter=start_iter,
        min_compression_rate=min_compression_rate,
        min_step_speedup=min_step_speedup,
        trial_steps=trial_steps,
    )


class _ErrorFeedback:
    kind = ""
    _rehearsal_keeps = ("last_sent_bytes",)  # what a rehearsed exchange changes besides the residuals

    @staticmethod
    def for_kind(kind: str):
        return {"powersgd": _PowerSGD, "topk": _TopK}[kind]

    def __init__(
        self,
        prefix,
        op,
        process_set,
        start_iter: int,
        min_compression_rate: float,
        min_step_speedup=None,
        trial_steps: int = 8,
    ):
        slow_link_settings.check_error_feedback(self.kind, op, start_iter, min_compression_rate)
        self.trial = CompressionTrial(start_iter, min_step_speedup, trial_steps, self.kind)
        self.prefix = prefix
        self.op = op
        self.process_set = process_set
        self.start_iter = start_iter
        self.min_compression_rate = min_compression_rate
        self.iteration = 0
        self.residuals: Dict[str, np.ndarray] = {}
        self.last_sent_bytes = 0
        self.last_dense_bytes = 0

    # ---------------------------------------------------------------- graph side

    def apply(self, grads, variables) -> list:
        """The reduced gradients (TF tensors, variables' dtypes) of this update's gradients."""
        bridge.check_not_xla(f"the gradient exchange (DistributedOptimizer(compression=Compression.{self.kind}))")
        dense = []
        for g, v in zip(grads, variables):
            g = tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)  # IndexedSlices: densified
            bridge.check_dtype(g, f"gradient of {v.name}")
            dense.append(g)
        reduced = tf.numpy_function(
            self.exchange, dense, [g.dtype for g in dense], stateful=True, name=f"Hvdlite{self.kind.capitalize()}"
        )
        if not isinstance(reduced, (list, tuple)):
            reduced = [reduced]
        for r, g in zip(reduced, dense):
            r.set_shape(g.shape)
        return [tf.cast(r, v.dtype) if r.dtype != v.dtype else r for r, v in zip(reduced, variables)]

    # ---------------------------------------------------------------- numpy side (the op's body)

    def exchange(self, *grads) -> List[np.ndarray]:
        self.iteration += 1
        grads = [np.array(g, copy=True) for g in grads]  # ours to overwrite; TensorFlow's buffers are not
        compress = self.trial.compresses(self.iteration)
        shadow = compress and self.trial.shadows(self.iteration)
        if not compress and self.residuals:
            self._send_residuals(grads)
        chosen = [i for i, g in enumerate(grads) if compress and self._compressible(g)]
        plain = [i for i in range(len(grads)) if i not in set(chosen)]
        began = time.perf_counter()  # the whole exchange follows the update's compute: all of it is waited for
        pending, flats = self._start_plain(grads, plain)
        error = None
        try:
            if chosen:
                (self._time_compressed if shadow else self._reduce_compressed)(grads, chosen)
        except BaseException as e:  # wait for the plain ones anyway: the core still writes into their buffers
            error = e
        self._finish_plain(grads, plain, pending, flats)
        waited = None if compress else time.perf_counter() - began
        if error is not None:
            raise error
        self.last_dense_bytes = sum(g.nbytes for g in grads)
        self.last_sent_bytes += sum(grads[i].nbytes for i in plain)
        timeline_counter(
            self.kind,
            {
                "sent_bytes": self.last_sent_bytes,
                "dense_bytes": self.last_dense_bytes,
                "compression_ratio": self.last_dense_bytes / max(1, self.last_sent_bytes),
                "compressing": int(compress),
            },
        )
        self.last_sent_bytes = 0
        work = self._compression_work(grads) if not compress and self.trial.measures_work(self.iteration) else None
        self.trial.step_done(self.iteration, self._agree, waited, work)
        if shadow:
            began = time.perf_counter()
            pending, flats = self._start_plain(grads, chosen)
            self._finish_plain(grads, chosen, pending, flats)
            self.trial.exclude(time.perf_counter() - began)
        return grads

    def _time_compressed(self, grads: List[np.ndarray], chosen: List[int]) -> None:
        """A trial update's compressed exchange, for its time: the gradients and residuals are left as they were
        (it replaces list items, never the arrays in them)."""
        residuals, self.residuals = self.residuals, {}
        try:
            self._reduce_compressed(list(grads), chosen)
        finally:
            self.residuals = residuals

    def _compression_work(self, grads: List[np.ndarray]) -> float:
        """Seconds a compressed exchange of this update's (reduced) gradients takes, compression and exchange: a
        rehearsal that every rank runs at the same update, left out of the update's timing. The trial weighs it
        against the wait compressing could save."""
        chosen = [i for i, g in enumerate(grads) if self._compressible(g)]
        if not chosen:
            return 0.0
        return self.trial.weigh_rehearsals(lambda: self._rehearse(grads, chosen))

    def _rehearse(self, grads: List[np.ndarray], chosen: List[int]) -> float:
        """One compressed exchange of grads, for its seconds, with nothing kept: the result is dropped and the
        residuals, warm start and byte count are put back."""
        kept = {name: copy.copy(getattr(self, name)) for name in self._rehearsal_keeps}
        began = time.perf_counter()
        try:
            self._time_compressed(grads, chosen)
        finally:
            for name, value in kept.items():
                setattr(self, name, value)
        return time.perf_counter() - began

    def _send_residuals(self, grads: List[np.ndarray]) -> None:
        """Adds each residual to its gradient, which then goes uncompressed: nothing the compression held back is
        lost when it stops."""
        for key, residual in list(self.residuals.items()):
            i = int(key)
            if i < len(grads) and residual.shape == grads[i].shape:
                grads[i] = (grads[i].astype(np.float32) + residual).astype(grads[i].dtype)
        self.residuals = {}

    def _agree(self, values, least: bool = False) -> List[float]:
        """The ranks' average of a few numbers (the trial's figures), or with `least` each one's minimum."""
        reduction = bridge.Collective(
            OP_ALLREDUCE,
            f"{self.prefix}.{self.kind}.trial.{'least' if least else 'average'}",
            ops.core_reduce_op(Min if least else Average),
            process_set_id=bridge.process_set_id(self.process_set),
            in_place=True,
        )
        return bridge.finish(bridge.start([reduction], np.array(values, np.float64)))[0].tolist()

    def _start_plain(self, grads, plain):
        dtypes = sorted({grads[i].dtype.name for i in plain})
        flats = [np.concatenate([grads[i].reshape(-1) for i in plain if grads[i].dtype.name == d]) for d in dtypes]
        collectives = [self._allreduce(f"plain.{d}") for d in dtypes]
        return (bridge.start(collectives, *flats) if flats else []), dict(zip(dtypes, flats))

    def _finish_plain(self, grads, plain, pending, flats) -> None:
        if not pending:
            return
        reduced = dict(zip(flats, bridge.finish(pending)))
        offsets = dict.fromkeys(flats, 0)
        for i in plain:
            dtype = grads[i].dtype.name
            count = grads[i].size
            grads[i] = reduced[dtype][offsets[dtype] : offsets[dtype] + count].reshape(grads[i].shape)
            offsets[dtype] += count

    def _allreduce(self, what: str) -> "bridge.Collective":
        return bridge.Collective(
            OP_ALLREDUCE,
            f"{self.prefix}.{self.kind}.{what}",
            ops.core_reduce_op(self.op),
            process_set_id=bridge.process_set_id(self.process_set),
            in_place=True,
        )

    def _allreduce_now(self, flat: np.ndarray, what: str) -> np.ndarray:
        return bridge.finish(bridge.start([self._allreduce(what)], flat))[0]

    def _size(self) -> int:
        return bridge.process_set_size(self.process_set)

    def _residual(self, key: str, like: np.ndarray) -> np.ndarray:
        residual = self.residuals.get(key)
        if residual is None or residual.shape != like.shape:
            residual = self.residuals[key] = np.zeros(like.shape, np.float32)
        return residual

    # ---------------------------------------------------------------- what a kind provides

    def _compressible(self, grad: np.ndarray) -> bool:
        raise NotImplementedError

    def _reduce_compressed(self, grads: List[np.ndarray], chosen: List[int]) -> None:
        raise NotImplementedError

    # ---------------------------------------------------------------- state (elastic commit/restore)

    def local_state(self) -> dict:
        """This rank's own state: its residuals."""
        return {"residuals": {k: v.copy() for k, v in self.residuals.items()}}

    def shared_state(self) -> dict:
        """State identical on every rank (broadcast from rank 0 when the membership changes)."""
        return {"iteration": self.iteration, "trial": self.trial.state()}

    def state_dict(self) -> dict:
        return {"local": self.local_state(), "shared": self.shared_state()}

    def load_state_dict(self, state: dict) -> None:
        if "local" in state:
            self.residuals = {k: np.array(v, copy=True) for k, v in state["local"]["residuals"].items()}
        if "shared" in state:
            self._load_shared(state["shared"])

    def _load_shared(self, shared: dict) -> None:
        self.iteration = int(shared["iteration"])
        self.trial.load_state(shared.get("trial", {}), self.iteration)


class _PowerSGD(_ErrorFeedback):
    """Each matrix-shaped gradient (n = its first dimension) approximated by P Q^T of rank r with one power
    iteration warm-started from last update's Q; computed in float32 whatever the gradient's dtype."""

    kind = "powersgd"
    _rehearsal_keeps = ("last_sent_bytes", "qs")

    def __init__(
        self,
        prefix,
        op,
        process_set,
        rank=1,
        start_iter=10,
        min_compression_rate=2,
        warm_start=True,
        seed=0,
        min_step_speedup=None,
        trial_steps=8,
    ):
        super().__init__(prefix, op, process_set, start_iter, min_compression_rate, min_step_speedup, trial_steps)
        slow_link_settings.check_powersgd_rank(rank)
        self.rank = rank
        self.warm_start = warm_start
        self.seed = seed
        self.qs: Dict[str, np.ndarray] = {}

    def _shape(self, grad):
        n = grad.shape[0]
        m = grad.size // n
        return n, m, min(self.rank, n, m)

    def _compressible(self, grad) -> bool:
        if grad.ndim < 2 or grad.size == 0:
            return False
        n, m, r = self._shape(grad)
        return (n + m) * r * self.min_compression_rate <= n * m

    def _initial_q(self, key: str, m: int, r: int) -> np.ndarray:
        # The same on every rank: seeded by the name and the step, never by the rank.
        step = 0 if self.warm_start else self.iteration
        generator = np.random.default_rng(zlib.crc32(f"{self.seed}:{key}:{step}".encode()))
        return generator.standard_normal((m, r)).astype(np.float32)

    def _reduce_compressed(self, grads, chosen) -> None:
        matrices, qs = [], []
        for i in chosen:
            key = str(i)
            n, m, r = self._shape(grads[i])
            matrix = grads[i].reshape(n, m).astype(np.float32) + self._residual(key, grads[i]).reshape(n, m)
            q = self.qs.get(key) if self.warm_start else None
            if q is None or q.shape != (m, r):
                q = self._initial_q(key, m, r)
            matrices.append(matrix)
            qs.append(q)
        ps = [matrix @ q for matrix, q in zip(matrices, qs)]
        flat_p = self._allreduce_now(np.concatenate([p.reshape(-1) for p in ps]), "P")
        ps = [np.linalg.qr(part.reshape(p.shape))[0] for part, p in zip(_split(flat_p, ps), ps)]
        new_qs = [matrix.T @ p for matrix, p in zip(matrices, ps)]
        flat_q = self._allreduce_now(np.concatenate([q.reshape(-1) for q in new_qs]), "Q")
        new_qs = [part.reshape(q.shape) for part, q in zip(_split(flat_q, new_qs), new_qs)]
        scale = float(self._size()) if self.op == Sum else 1.0  # P Q^T then approximates the sum of the Ms
        for i, matrix, left, right in zip(chosen, matrices, ps, new_qs):
            approximation = left @ right.T
            # What this rank wanted to send and the average did not carry, in mean units also with Sum.
            self.residuals[str(i)] = (matrix - approximation / scale).reshape(grads[i].shape)
            if self.warm_start:
                self.qs[str(i)] = right / scale
            grads[i] = approximation.reshape(grads[i].shape).astype(grads[i].dtype)
        self.last_sent_bytes += flat_p.nbytes + flat_q.nbytes

    def shared_state(self) -> dict:
        return dict(super().shared_state(), qs={k: v.copy() for k, v in self.qs.items()})

    def _load_shared(self, shared: dict) -> None:
        super()._load_shared(shared)
        self.qs = {k: np.array(v, copy=True) for k, v in shared.get("qs", {}).items()}


class _TopK(_ErrorFeedback):
    """Of each matrix-shaped gradient plus its residual, the `ratio` share of entries largest in magnitude, sent
    as (index, value) pairs allgathered from every rank and summed into the dense result."""

    kind = "topk"

    def __init__(
        self,
        prefix,
        op,
        process_set,
        ratio=0.01,
        start_iter=10,
        min_compression_rate=2,
        min_step_speedup=None,
        trial_steps=8,
    ):
        super().__init__(prefix, op, process_set, start_iter, min_compression_rate, min_step_speedup, trial_steps)
        slow_link_settings.check_topk_ratio(ratio)
        self.ratio = ratio

    def _k(self, grad) -> int:
        return max(1, math.ceil(self.ratio * grad.size))

    def _compressible(self, grad) -> bool:
        return grad.ndim >= 2 and 2 * self._k(grad) * self.min_compression_rate <= grad.size

    def _reduce_compressed(self, grads, chosen) -> None:
        indices, values, totals, offsets, offset = [], [], [], [], 0
        for i in chosen:
            total = grads[i].reshape(-1).astype(np.float32) + self._residual(str(i), grads[i]).reshape(-1)
            k = self._k(grads[i])
            index = np.argpartition(np.abs(total), total.size - k)[total.size - k :]
            indices.append(index.astype(np.int64) + offset)
            values.append(total[index])
            totals.append(total)
            offsets.append(offset)
            offset += total.size
        flat_index, flat_values = np.concatenate(indices), np.concatenate(values)
        set_id = bridge.process_set_id(self.process_set)
        gathered = bridge.finish(
            bridge.start(
                [
                    bridge.Collective(OP_ALLGATHER, f"{self.prefix}.{self.kind}.index", process_set_id=set_id),
                    bridge.Collective(OP_ALLGATHER, f"{self.prefix}.{self.kind}.values", process_set_id=set_id),
                ],
                flat_index,
                flat_values,
            )
        )
        dense = np.zeros(offset, np.float32)
        np.add.at(dense, gathered[0], gathered[1])
        if self.op == Average:
            dense /= self._size()
        for i, total, index, start in zip(chosen, totals, indices, offsets):
            total[index - start] = 0  # what was sent leaves the residual
            self.residuals[str(i)] = total.reshape(grads[i].shape)
            grads[i] = dense[start : start + total.size].reshape(grads[i].shape).astype(grads[i].dtype)
        self.last_sent_bytes += flat_index.nbytes + flat_values.nbytes


def _split(flat: np.ndarray, like) -> List[np.ndarray]:
    return np.split(flat, np.cumsum([a.size for a in like])[:-1])
