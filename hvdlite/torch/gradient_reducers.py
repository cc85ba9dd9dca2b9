"""Gradient reducers with error feedback: PowerSGD (low-rank) and top-k (sparse) compression of the averaged
gradient, for DistributedOptimizer(compression=hvd.Compression.powersgd(...) / hvd.Compression.topk(...)).

Unlike a cast compressor, a reducer needs several collectives per step with computation between them and keeps
state across steps, so the optimizer hands it every gradient at once in synchronize(). What a reducer does not
send this step stays in a per-rank residual that is added to the next step's gradient (error feedback): over
any number of steps, the updates applied plus the ranks' mean residual equal the sum of the true averaged
gradients, so nothing the compression dropped is lost, only delayed.

Gradients that compression would not shrink (vectors, small matrices) are allreduced as they are, through the
core's fusion. The first `start_iter` steps reduce every gradient uncompressed, since early gradients change
fast and a residual built from them is mostly stale. With `min_step_speedup`, a trial over the last of those steps
and the first compressed ones decides whether compressing pays on this job's links at all
(hvdlite/common/compression_trial.py); where it does not, the residuals are sent with the next step's gradients
and every later step is reduced uncompressed. The trial's compressed steps are timed but apply the exact average
(CompressionTrial), so a trial that decides against compressing costs no progress.
"""

import copy
import math
import time
import zlib
from typing import Dict, List, Optional, Sequence

import torch

from hvdlite.common import basics, slow_link_settings
from hvdlite.common.compression_trial import CompressionTrial
from hvdlite.common.ops import Average, Min, Sum


class ReducerSpec:
    """What Compression.powersgd(...) / Compression.topk(...) return: the settings, from which each optimizer
    builds its own reducer (the state belongs to one optimizer's parameters)."""

    def __init__(self, cls, **settings):
        cls(names={}, process_set=None, op=Average, collectives=None, **settings)  # bad settings fail here, now
        self.cls = cls
        self.settings = settings

    def build(self, names: Dict[int, str], process_set, op, collectives):
        return self.cls(names=names, process_set=process_set, op=op, collectives=collectives, **self.settings)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return f"Compression.{self.cls.kind}({args})"


class _ErrorFeedbackReducer:
    """The part both reducers share: the step count, the plain path, residuals and their state."""

    kind = ""

    def __init__(
        self,
        names,
        process_set,
        op,
        collectives,
        start_iter: int,
        min_compression_rate: float,
        min_step_speedup=None,
        trial_steps: int = 8,
    ):
        slow_link_settings.check_error_feedback(self.kind, op, start_iter, min_compression_rate)
        self.trial = CompressionTrial(start_iter, min_step_speedup, trial_steps, self.kind)
        self.names = names
        self.collectives = collectives  # hvdlite.torch.mpi_ops (passed in: that module imports this one's users)
        self.process_set = process_set
        self.op = op
        self.start_iter = start_iter
        self.min_compression_rate = min_compression_rate
        self.iteration = 0
        self.residuals: Dict[str, torch.Tensor] = {}
        # Figures of the last step, for the timeline and tests: what each rank sent against the uncompressed.
        self.last_sent_elements = 0
        self.last_dense_elements = 0
        self.last_sent_bytes = 0
        self.last_dense_bytes = 0

    # What a compression changes besides the gradients, and its rehearsal (_compression_work) restores.
    _rehearsal_keeps = ("residuals", "last_sent_elements", "last_sent_bytes")

    # -- what a subclass provides
    def _compressible(self, grad: torch.Tensor) -> bool:
        raise NotImplementedError

    def _reduce_compressed(self, params: List[torch.Tensor]) -> None:
        raise NotImplementedError

    # -- the step
    def reduce(self, params: Sequence[torch.Tensor]) -> None:
        """Replaces each parameter's .grad by its reduced (averaged or summed) gradient."""
        self.iteration += 1
        for p in params:
            self.check_dense(p)
        compress = self.trial.compresses(self.iteration)
        shadow = compress and self.trial.shadows(self.iteration)
        if not compress and self.residuals:
            for p in params:
                self.add_residual(p, p.grad)
        compressed = [p for p in params if compress and self._compressible(p.grad)]
        chosen = {id(p) for p in compressed}
        plain = [p for p in params if id(p) not in chosen]
        handles = [self._allreduce_async(p) for p in plain]  # fused in the core while we compress
        self.last_dense_elements = sum(p.grad.numel() for p in params)
        self.last_sent_elements = sum(p.grad.numel() for p in plain)
        self.last_dense_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params)
        self.last_sent_bytes = sum(p.grad.numel() * p.grad.element_size() for p in plain)
        error = None
        try:
            if compressed:
                (self._time_compressed if shadow else self._reduce_compressed)(compressed)
        except BaseException as e:  # wait for the plain ones anyway: the core still writes into their buffers
            error = e
        self._finish(plain, handles)
        if error is not None:
            raise error
        self._step_done(params, compress)
        if shadow:
            began = time.perf_counter()
            self._finish(compressed, [self._allreduce_async(p) for p in compressed])
            self.trial.exclude(time.perf_counter() - began)

    def _time_compressed(self, params: List[torch.Tensor]) -> None:
        """A trial step's compressed exchange, for its time: the gradients and residuals are left as they were
        (the copies that keep them are not timed); its warm start carries on."""
        self._compress_on_copies(params, ("residuals",))

    def _compress_on_copies(self, params: List[torch.Tensor], keep: Sequence[str]) -> float:
        """Runs the compressed exchange of params starting from no residuals, then puts back their gradients and
        the attributes named in `keep`; returns the exchange's seconds. The copying is left out of the trial's
        timing."""
        began = time.perf_counter()
        grads = [p.grad.clone() for p in params]
        kept = {name: copy.copy(getattr(self, name)) for name in keep}
        self.residuals = {}
        started = time.perf_counter()
        self.trial.exclude(started - began)
        try:
            self._reduce_compressed(params)
        finally:
            ended = time.perf_counter()
            for name, value in kept.items():
                setattr(self, name, value)
            for p, grad in zip(params, grads):
                p.grad.copy_(grad)
            self.trial.exclude(time.perf_counter() - ended)
        return ended - started

    def _finish(self, params: List[torch.Tensor], handles) -> None:
        """Waits for the params' allreduces and puts each result in its .grad."""
        for p, (handle, wire) in zip(params, handles):
            reduced = self.collectives.synchronize(handle)
            if wire is not p.grad:
                p.grad.copy_(reduced.view_as(p.grad))

    # -- steps the optimizer reduces itself (uncompressed, overlapped with backward where it does that)
    def compresses_next(self) -> bool:
        """Whether the next step compresses; when it does not, the optimizer reduces it the usual way, calling
        add_residual on each gradient before it goes out and plain_step_done after the step."""
        return self.trial.compresses(self.iteration + 1)

    def check_dense(self, p: torch.Tensor) -> None:
        """Refuses a sparse gradient on every step, compressed or not, so that the error comes at the first."""
        if p.grad is not None and p.grad.is_sparse:
            raise ValueError(
                f"{self.kind} compression reduces dense gradients; {self.names[id(p)]} has a sparse one "
                "(use sparse_as_dense=True or an uncompressed optimizer)"
            )

    def add_residual(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        """Adds p's residual (if any) to its dense gradient `grad`, which then goes uncompressed: nothing the
        compression held back is lost when it stops."""
        residual = self.residuals.pop(self.names[id(p)], None) if self.residuals else None
        if residual is not None and residual.shape == grad.shape:
            grad.add_(residual)

    def plain_step_done(self, params: Sequence[torch.Tensor], waited: Optional[float] = None) -> None:
        """After a step the optimizer reduced; `waited`: the seconds it waited for the exchange after backward."""
        self.iteration += 1
        dense = sum(p.numel() for p in params)
        self.last_dense_elements = self.last_sent_elements = dense
        self.last_dense_bytes = self.last_sent_bytes = sum(p.numel() * p.element_size() for p in params)
        self._step_done(params, False, waited)

    def _step_done(self, params: Sequence[torch.Tensor], compress: bool, waited: Optional[float] = None) -> None:
        work = self._compression_work(params) if not compress and self.trial.measures_work(self.iteration) else None
        basics.timeline_counter(
            self.kind,
            {
                "sent_bytes": self.last_sent_bytes,
                "dense_bytes": self.last_dense_bytes,
                "compression_ratio": self.last_dense_bytes / max(1, self.last_sent_bytes),
                "compressing": int(compress),
            },
        )
        self.trial.step_done(self.iteration, self._agree, waited, work)

    def _compression_work(self, params: Sequence[torch.Tensor]) -> float:
        """Seconds a compressed exchange of these gradients takes, compression and exchange, after this step's
        own: a rehearsal on copies (every rank runs it at the same step; the result is dropped and no state kept),
        left out of the step's timing. The trial weighs it against the wait compressing could save."""
        chosen = [p for p in params if p.grad is not None and not p.grad.is_sparse and self._compressible(p.grad)]
        if not chosen:
            return 0.0
        return self.trial.weigh_rehearsals(lambda: self._compress_on_copies(chosen, self._rehearsal_keeps))

    def _agree(self, values: Sequence[float], least: bool = False) -> Sequence[float]:
        """The ranks' average of a few numbers (the trial's figures), or with `least` each one's minimum."""
        mine = torch.tensor(list(values), dtype=torch.float64)
        return self.collectives.allreduce_(
            mine,
            name=f"{self.kind}.trial.{'least' if least else 'average'}",
            op=Min if least else Average,
            process_set=self.process_set,
        ).tolist()

    def _allreduce_async(self, p: torch.Tensor):
        wire = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
        handle = self.collectives.allreduce_async_(
            wire, name=f"allreduce.{self.names[id(p)]}", op=self.op, process_set=self.process_set
        )
        return handle, wire

    def _allreduce_flat(self, flat: torch.Tensor, what: str) -> torch.Tensor:
        """Allreduces one fused buffer in place with the optimizer's op."""
        return self.collectives.allreduce_(flat, name=f"{self.kind}.{what}", op=self.op, process_set=self.process_set)

    def _size(self) -> int:
        return self.process_set.size()

    def _residual(self, key: str, like: torch.Tensor) -> torch.Tensor:
        """The residual kept for `key`, contiguous (reducers work in it through flat views), zeros at first."""
        residual = self.residuals.get(key)
        if residual is None or residual.shape != like.shape:
            residual = self.residuals[key] = torch.zeros_like(like, memory_format=torch.contiguous_format)
        elif not residual.is_contiguous():
            residual = self.residuals[key] = residual.contiguous()
        return residual

    # -- state (elastic commit/restore)
    def local_state(self) -> dict:
        """This rank's own state: its residuals."""
        return {"residuals": {k: v.detach().clone() for k, v in self.residuals.items()}}

    def shared_state(self) -> dict:
        """State identical on every rank (broadcast from rank 0 when the membership changes)."""
        return {"iteration": self.iteration, "trial": self.trial.state()}

    def state_dict(self) -> dict:
        return {"local": self.local_state(), "shared": self.shared_state()}

    def load_state_dict(self, state: dict) -> None:
        if "local" in state:
            self.residuals = {k: v.detach().clone() for k, v in state["local"]["residuals"].items()}
        if "shared" in state:
            self._load_shared(state["shared"])

    def _load_shared(self, shared: dict) -> None:
        self.iteration = int(shared["iteration"])
        self.trial.load_state(shared.get("trial", {}), self.iteration)


class PowerSGDReducer(_ErrorFeedbackReducer):
    """PowerSGD (Vogels, Karimireddy and Jaggi, 2019): each gradient reshaped to an n x m matrix M (n = the
    first dimension) is approximated by P Q^T of rank r with one power iteration, warm-started from last step's
    Q: P = M Q, allreduce(P), orthonormalise P, Q = M^T P, allreduce(Q). All matrices' P travel in one buffer
    and all Q in another, so a step costs two allreduces of (n + m) r elements per matrix instead of n m."""

    kind = "powersgd"
    _rehearsal_keeps = _ErrorFeedbackReducer._rehearsal_keeps + ("qs",)

    def __init__(
        self,
        names,
        process_set,
        op,
        collectives,
        rank: int = 1,
        start_iter: int = 10,
        min_compression_rate: float = 2,
        warm_start: bool = True,
        seed: int = 0,
        min_step_speedup=None,
        trial_steps: int = 8,
    ):
        super().__init__(
            names, process_set, op, collectives, start_iter, min_compression_rate, min_step_speedup, trial_steps
        )
        slow_link_settings.check_powersgd_rank(rank)
        self.rank = rank
        self.warm_start = warm_start
        self.seed = seed
        self.qs: Dict[str, torch.Tensor] = {}

    def _shape(self, grad: torch.Tensor):
        n = grad.shape[0]
        m = grad.numel() // n
        return n, m, min(self.rank, n, m)

    def _compressible(self, grad: torch.Tensor) -> bool:
        if grad.dim() < 2 or grad.numel() == 0:
            return False
        n, m, r = self._shape(grad)
        return (n + m) * r * self.min_compression_rate <= n * m

    def _initial_q(self, name: str, m: int, r: int, like: torch.Tensor) -> torch.Tensor:
        # Every rank draws the same Q: the seed depends only on the name and the step, never on the rank (and
        # not on Python's per-process string hashing).
        step = 0 if self.warm_start else self.iteration
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{name}:{step}".encode()))
        q = torch.randn(m, r, generator=generator, dtype=torch.float32)
        return q.to(device=like.device, dtype=like.dtype)

    def _reduce_compressed(self, params: List[torch.Tensor]) -> None:
        # M = gradient + residual is built in the residual's own memory, and M minus what the average carried is
        # left there at the end: no gradient-sized tensor is allocated or copied. An error in between takes the
        # gradient back out, so the residual is as it was.
        matrices, qs, names = [], [], []
        try:
            for p in params:
                name = self.names[id(p)]
                n, m, r = self._shape(p.grad)
                matrix = self._residual(name, p.grad).view(n, m)
                matrix.add_(p.grad.reshape(n, m))
                matrices.append(matrix)
                q = self.qs.get(name) if self.warm_start else None
                if q is None or q.shape != (m, r):
                    q = self._initial_q(name, m, r, matrix)
                qs.append(q)
                names.append(name)
            ps = [matrix @ q for matrix, q in zip(matrices, qs)]
            flat_p = self._allreduce_flat(torch.cat([p.reshape(-1) for p in ps]), "P")
            ps = [_orthonormal(part.view_as(p)) for part, p in zip(_split(flat_p, ps), ps)]
            new_qs = [matrix.t() @ p for matrix, p in zip(matrices, ps)]
            flat_q = self._allreduce_flat(torch.cat([q.reshape(-1) for q in new_qs]), "Q")
        except BaseException:
            for p, matrix in zip(params, matrices):
                matrix.sub_(p.grad.reshape(matrix.shape))
            raise
        new_qs = [part.view_as(q) for part, q in zip(_split(flat_q, new_qs), new_qs)]
        scale = float(self._size()) if self.op == Sum else 1.0  # P Q^T then approximates the sum of the Ms
        for p, name, matrix, left, right in zip(params, names, matrices, ps, new_qs):
            if p.grad.is_contiguous():
                approximation = torch.mm(left, right.t(), out=p.grad.view(matrix.shape))
            else:
                approximation = left @ right.t()
                p.grad.copy_(approximation.view_as(p.grad))
            # Residual: what this rank wanted to send and the average did not carry. With Sum, the average's
            # share of this rank is the approximation of the mean, so the residual is kept in mean units.
            matrix.sub_(approximation, alpha=1.0 / scale)
            if self.warm_start:
                self.qs[name] = right / scale if scale != 1.0 else right.clone()
        self.last_sent_elements += flat_p.numel() + flat_q.numel()
        self.last_sent_bytes += (flat_p.numel() + flat_q.numel()) * flat_p.element_size()

    def shared_state(self) -> dict:
        return dict(super().shared_state(), qs={k: v.detach().clone() for k, v in self.qs.items()})

    def _load_shared(self, shared: dict) -> None:
        super()._load_shared(shared)
        self.qs = {k: v.detach().clone() for k, v in shared.get("qs", {}).items()}


class TopKReducer(_ErrorFeedbackReducer):
    """Top-k sparsification: of each matrix-shaped gradient (plus its residual) only the `ratio` share of
    entries largest in magnitude is sent, as (index, value) pairs allgathered from every rank and summed into
    the dense result; the rest stays in the residual."""

    kind = "topk"

    def __init__(
        self,
        names,
        process_set,
        op,
        collectives,
        ratio: float = 0.01,
        start_iter: int = 10,
        min_compression_rate: float = 2,
        min_step_speedup=None,
        trial_steps: int = 8,
    ):
        super().__init__(
            names, process_set, op, collectives, start_iter, min_compression_rate, min_step_speedup, trial_steps
        )
        slow_link_settings.check_topk_ratio(ratio)
        self.ratio = ratio

    def _k(self, grad: torch.Tensor) -> int:
        return max(1, math.ceil(self.ratio * grad.numel()))

    def _compressible(self, grad: torch.Tensor) -> bool:
        # An index and a value per kept entry: 2 k numbers against numel.
        return grad.dim() >= 2 and 2 * self._k(grad) * self.min_compression_rate <= grad.numel()

    def _reduce_compressed(self, params: List[torch.Tensor]) -> None:
        indices, values, offsets, offset = [], [], [], 0
        accumulated = []
        for p in params:
            name = self.names[id(p)]
            total = p.grad.reshape(-1) + self._residual(name, p.grad).reshape(-1)
            _, index = total.abs().topk(self._k(p.grad), sorted=False)
            indices.append(index + offset)
            values.append(total[index])
            accumulated.append(total)
            offsets.append(offset)
            offset += total.numel()
        flat_index = torch.cat(indices)
        flat_values = torch.cat(values)
        handle = self.collectives.grouped_allgather_async(
            [flat_index, flat_values], name=f"{self.kind}.pairs", process_set=self.process_set
        )
        all_index, all_values = self.collectives.synchronize(handle)
        dense = torch.zeros(offset, dtype=flat_values.dtype, device=flat_values.device)
        dense.index_add_(0, all_index, all_values)
        if self.op == Average:
            dense /= self._size()
        for p, total, index, start in zip(params, accumulated, indices, offsets):
            name = self.names[id(p)]
            total[index - start] = 0  # what was sent leaves the residual
            self._residual(name, p.grad).copy_(total.view_as(p.grad))
            p.grad.copy_(dense[start : start + total.numel()].view_as(p.grad))
        self.last_sent_elements += 2 * flat_index.numel()
        self.last_sent_bytes += flat_index.numel() * (flat_index.element_size() + flat_values.element_size())


def _split(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return list(torch.split(flat, [t.numel() for t in like]))


def _orthonormal(matrix: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning `matrix`'s (reduced QR). The input is identical on every rank after the
    allreduce, and so is the result."""
    if matrix.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.qr(matrix.float()).Q.to(matrix.dtype)
    return torch.linalg.qr(matrix).Q


def powersgd(
    rank: int = 1,
    start_iter: int = 10,
    min_compression_rate: float = 2,
    warm_start: bool = True,
    seed: int = 0,
    min_step_speedup=None,
    trial_steps: int = 8,
) -> ReducerSpec:
    """PowerSGD compression with error feedback (see PowerSGDReducer); `rank` is the approximation's rank.
    min_step_speedup: compress only if the last trial_steps uncompressed steps and the first trial_steps compressed
    ones show the compressed this many times shorter (None: always compress after start_iter)."""
    return ReducerSpec(
        PowerSGDReducer,
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
) -> ReducerSpec:
    """Top-k sparsification with error feedback (see TopKReducer); `ratio` of each gradient's entries is sent.
    min_step_speedup and trial_steps as for powersgd."""
    return ReducerSpec(
        TopKReducer,
        ratio=ratio,
        start_iter=start_iter,
        min_compression_rate=min_compression_rate,
        min_step_speedup=min_step_speedup,
        trial_steps=trial_steps,
    )


def is_reducer(compression) -> bool:
    return isinstance(compression, ReducerSpec)


__all__ = ["PowerSGDReducer", "TopKReducer", "ReducerSpec", "powersgd", "topk", "is_reducer"]
