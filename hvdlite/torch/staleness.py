"""Bounded staleness for DistributedOptimizer(staleness=s): step t applies the gradients averaged at step t - s.

Each step's gradients are copied into one flat buffer per dtype and their allreduce is started without waiting;
the step then waits only for the allreduce started s steps earlier and applies that average. The reduction of a
step's gradients therefore runs while the next s steps compute, which hides a slow link as long as one step's
compute covers 1/s of its transfer.

The bound needs no extra protocol: the average of step t - s exists only once every rank has submitted step
t - s's gradients, and the coordinator declares that allreduce ready only then. A rank that finished step t has
waited for it, so no rank starts step t + 1 before every other rank finished computing step t - s: it is never
more than s steps ahead of the slowest.

Every rank applies the same averages in the same order, so the parameters stay identical everywhere; what
changes is that each applied gradient was computed on parameters up to s updates older than the ones it updates.
The first s steps have nothing to apply yet (the optimizer does not step), and drain() applies what is still in
flight, e.g. before evaluating or saving the final model.
"""

import collections
from typing import Deque, Dict, Iterator, List

import torch

from hvdlite.common import basics


class _InFlight:
    """One step's gradients: their flat buffers by dtype and, until the average arrived, the allreduce handles."""

    __slots__ = ("buffers", "handles", "contexts")

    def __init__(self, buffers: Dict[torch.dtype, torch.Tensor], handles, contexts):
        self.buffers, self.handles, self.contexts = buffers, handles, contexts


class BoundedStaleness:
    def __init__(
        self,
        params: List[torch.Tensor],
        process_set,
        op,
        compression,
        prescale: float,
        postscale: float,
        collectives,
        staleness: int,
    ):
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 1:
            raise ValueError(
                f"staleness must be an integer >= 1 (the steps a gradient may be applied late), got {staleness!r}"
            )
        self.params = params
        self.process_set = process_set
        self.op = op
        self.compression = compression
        self.prescale, self.postscale = prescale, postscale
        self.collectives = collectives  # hvdlite.torch.mpi_ops, passed in (it imports the optimizer's users)
        self.staleness = staleness
        self.steps = 0  # gradients submitted so far (optimizer steps, including those with nothing to apply)
        self.in_flight: Deque[_InFlight] = collections.deque()
        # The parameters of each dtype, in order, and where each lives in its dtype's flat buffer.
        self.by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for p in params:
            self.by_dtype.setdefault(p.dtype, []).append(p)
        # The buffers of the average applied last step, reused for the next step's gradients: a new flat buffer
        # of the model's size every step would cost page faults on the host.
        self.spare: Dict[torch.dtype, torch.Tensor] = {}

    def exchange(self) -> bool:
        """Starts the allreduce of the current gradients and, once s are in flight, puts the oldest average into
        the parameters' .grad. Returns whether there is something to apply this step."""
        buffers = {}
        for dtype, params in self.by_dtype.items():
            size = sum(p.numel() for p in params)
            flat = self.spare.pop(dtype, None)
            if flat is None or flat.numel() != size or flat.dtype != dtype:
                flat = torch.empty(size, dtype=dtype, device=params[0].device)
            offset = 0
            for p in params:
                view = flat[offset : offset + p.numel()].view_as(p)
                if p.grad is None:  # no gradient on this rank this step: contribute zeros so others do not wait
                    view.zero_()
                else:
                    view.copy_(p.grad.to_dense() if p.grad.is_sparse else p.grad)
                offset += p.numel()
            buffers[dtype] = flat
        self._submit(buffers)
        self.steps += 1
        apply = len(self.in_flight) > self.staleness
        sent = 0
        if apply:
            oldest = self.in_flight.popleft()
            self._wait(oldest)
            self._write_gradients(oldest.buffers)
            sent = sum(b.numel() * b.element_size() for b in oldest.buffers.values())
            self.spare = {d: b.reshape(-1) for d, b in oldest.buffers.items() if b.is_contiguous()}
        basics.timeline_counter(
            "staleness", {"in_flight": len(self.in_flight), "applied_bytes": sent, "bound": self.staleness}
        )
        return apply

    def drain(self) -> Iterator[None]:
        """Waits for every average still in flight and yields after writing each into .grad, oldest first; the
        caller steps the optimizer once per yield."""
        while self.in_flight:
            oldest = self.in_flight.popleft()
            self._wait(oldest)
            self._write_gradients(oldest.buffers)
            yield

    def _submit(self, buffers: Dict[torch.dtype, torch.Tensor]) -> None:
        slot = self.steps % (self.staleness + 1)  # names repeat, so the response cache applies
        handles, contexts = {}, {}
        for dtype, flat in buffers.items():
            wire, contexts[dtype] = self.compression.compress(flat)
            handles[dtype] = self.collectives.allreduce_async_(
                wire,
                name=f"staleness.{slot}.{str(dtype).replace('torch.', '')}",
                op=self.op,
                prescale_factor=self.prescale,
                postscale_factor=self.postscale,
                process_set=self.process_set,
            )
        self.in_flight.append(_InFlight(buffers, handles, contexts))

    def _wait(self, entry: _InFlight) -> None:
        if entry.handles is None:
            return
        errors = []
        for dtype, handle in entry.handles.items():  # wait for all, even after a failure: they use our buffers
            try:
                reduced = self.collectives.synchronize(handle)
                entry.buffers[dtype] = self.compression.decompress(reduced, entry.contexts[dtype])
            except Exception as e:  # noqa: BLE001 - re-raised below, after the others finished
                errors.append(e)
        entry.handles = entry.contexts = None
        if errors:
            self.in_flight.clear()  # a failed exchange leaves nothing to apply: elastic training restores
            raise errors[0]

    def _write_gradients(self, buffers: Dict[torch.dtype, torch.Tensor]) -> None:
        for dtype, params in self.by_dtype.items():
            flat, offset = buffers[dtype], 0
            for p in params:
                averaged = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
                if p.grad is None:
                    p.grad = averaged.clone()
                elif p.grad.is_sparse:
                    p.grad = averaged.to_sparse(p.grad.sparse_dim())
                else:
                    p.grad.copy_(averaged)

    # -- state (elastic): after the waits, the averages in flight are identical on every rank
    def shared_state(self) -> dict:
        for entry in self.in_flight:
            self._wait(entry)
        return {
            "steps": self.steps,
            "averages": [{str(d): b.detach().clone() for d, b in e.buffers.items()} for e in self.in_flight],
        }

    def state_dict(self) -> dict:
        return {"local": {}, "shared": self.shared_state()}

    def load_state_dict(self, state: dict) -> None:
        shared = state.get("shared")
        if shared is None:
            return
        for entry in self.in_flight:  # the core may still write into their buffers: let it finish first
            if entry.handles is not None:
                for handle in entry.handles.values():
                    try:
                        self.collectives.synchronize(handle)
                    except Exception:  # noqa: BLE001, S110 - failed with the world being restored; discarded anyway
                        pass
        self.steps = int(shared["steps"])
        dtypes = {str(d): d for d in self.by_dtype}
        device = {d: params[0].device for d, params in self.by_dtype.items()}
        restored = collections.deque()
        for averages in shared["averages"]:
            buffers = {dtypes[k]: v.detach().clone().to(device[dtypes[k]]) for k, v in averages.items()}
            restored.append(_InFlight(buffers, None, None))
        self.in_flight = restored
