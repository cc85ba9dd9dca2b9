"""Bounded staleness for the Keras DistributedOptimizer (staleness=s), as in hvdlite.torch.staleness.

Each apply() hands the gradients to one stateful `tf.numpy_function`, whose body concatenates them into one
buffer per dtype, starts their allreduce (bridge.start) without waiting and keeps it in a queue on the Python
side. Once s exchanges are in flight it waits for the oldest (bridge.finish) and returns its average, which the
optimizer applies; before that it says there is nothing to apply. The queue lives outside TensorFlow's tracking
(nothing of it is saved with the model), and the bound on how far a rank runs ahead comes, as in torch, from the
coordinator declaring an allreduce ready only once every rank submitted it.
"""

import collections
from typing import Deque, List

import numpy as np
import tensorflow as tf

from hvdlite.common import ops
from hvdlite.common.basics import OP_ALLREDUCE, timeline_counter
from hvdlite.tensorflow import bridge


class StaleExchange:
    def __init__(self, staleness: int, reducer):
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 1:
            raise ValueError(
                f"staleness must be an integer >= 1 (the steps a gradient may be applied late), got {staleness!r}"
            )
        self.staleness = staleness
        self.reducer = reducer  # the optimizer's GradientReducer: name prefix, op, scale factors, process set
        # (bridge.start's pending, dtypes, shapes) while running; (None, averages) once waited for (a commit)
        self.in_flight: Deque[tuple] = collections.deque()
        self.steps = 0

    # ---------------------------------------------------------------- graph side

    def apply(self, grads, variables, trainable_variables, parent_apply) -> None:
        """Submits this step's gradients; applies (parent_apply) the average of s steps ago, if one is due."""
        bridge.check_not_xla("the gradient allreduce (DistributedOptimizer(staleness=...))")
        reducer = self.reducer
        if reducer.local_vars:
            raise ValueError("staleness cannot be combined with local layers (PartialDistributedOptimizer)")
        dense, contexts = [], []
        for g, v in zip(grads, variables):
            g = tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)  # IndexedSlices: densified
            wire, ctx = reducer.compression.compress(g)
            bridge.check_dtype(wire, f"gradient of {v.name}")
            dense.append(wire)
            contexts.append(ctx)
        outputs = tf.numpy_function(
            self.exchange, dense, [tf.bool] + [w.dtype for w in dense], stateful=True, name="HvdliteStaleExchange"
        )
        due, averaged = outputs[0], outputs[1:]
        due.set_shape([])
        for a, w in zip(averaged, dense):
            a.set_shape(w.shape)
        averaged = [reducer.compression.decompress(a, ctx) for a, ctx in zip(averaged, contexts)]
        averaged = [tf.cast(a, v.dtype) if a.dtype != v.dtype else a for a, v in zip(averaged, variables)]

        def apply_average():
            parent_apply(averaged, trainable_variables)

        tf.cond(due, apply_average, lambda: None)

    # ---------------------------------------------------------------- numpy side (the op's body)

    def exchange(self, *grads) -> List[np.ndarray]:
        dtypes = sorted({g.dtype.name for g in grads})
        flats = [np.concatenate([g.reshape(-1) for g in grads if g.dtype.name == d]) for d in dtypes]
        slot = self.steps % (self.staleness + 1)  # names repeat, so the response cache applies
        reducer = self.reducer
        collectives = [
            bridge.Collective(
                OP_ALLREDUCE,
                f"{reducer.prefix}.staleness.{slot}.{d}",
                ops.core_reduce_op(reducer.op),
                reducer.prescale,
                reducer.postscale,
                process_set_id=bridge.process_set_id(reducer.process_set),
                in_place=True,
            )
            for d in dtypes
        ]
        pending = bridge.start(collectives, *flats)
        self.in_flight.append((pending, [g.dtype for g in grads], [g.shape for g in grads]))
        self.steps += 1
        if len(self.in_flight) <= self.staleness:
            timeline_counter(
                "staleness", {"in_flight": len(self.in_flight), "applied_bytes": 0, "bound": self.staleness}
            )
            return [np.bool_(False)] + [np.zeros(g.shape, g.dtype) for g in grads]
        averages = self._finish_oldest()
        timeline_counter(
            "staleness",
            {
                "in_flight": len(self.in_flight),
                "applied_bytes": sum(a.nbytes for a in averages),
                "bound": self.staleness,
            },
        )
        return [np.bool_(True)] + averages

    def _finish_oldest(self) -> List[np.ndarray]:
        return self._finish(self.in_flight.popleft())

    def _finish(self, entry) -> List[np.ndarray]:
        if entry[0] is None:
            return entry[1]
        pending, dtypes, shapes = entry
        try:
            flats = dict(zip(sorted({d.name for d in dtypes}), bridge.finish(pending)))
        except Exception:
            self.in_flight.clear()  # a failed exchange: nothing in flight is worth applying any more
            raise
        offsets = collections.Counter()
        averages = []
        for dtype, shape in zip(dtypes, shapes):
            count = int(np.prod(shape, dtype=np.int64))
            start = offsets[dtype.name]
            averages.append(flats[dtype.name][start : start + count].reshape(shape))
            offsets[dtype.name] += count
        return averages

    # ---------------------------------------------------------------- elastic state

    def settle(self) -> dict:
        """Waits for everything in flight and returns the step count and copies of the averages, oldest first:
        identical on every rank, so a commit can hold them and a restore or a new rank gets them back (load)."""
        self.in_flight = collections.deque((None, self._finish(entry)) for entry in list(self.in_flight))
        return {"steps": self.steps, "averages": [[np.array(a, copy=True) for a in e[1]] for e in self.in_flight]}

    def load(self, state: dict) -> None:
        for entry in self.in_flight:  # the core may still write into their buffers: let it finish first
            if entry[0] is not None:
                try:
                    bridge.finish(entry[0])
                except Exception:  # noqa: BLE001, S110 - failed with the world being restored; discarded anyway
                    pass
        self.steps = int(state.get("steps", 0))
        averages = state.get("averages", [])
        self.in_flight = collections.deque((None, [np.array(a, copy=True) for a in step]) for step in averages)

    def drain(self):
        """Yields the averages still in flight, oldest first (numpy arrays in apply()'s order)."""
        while self.in_flight:
            yield self._finish_oldest()
