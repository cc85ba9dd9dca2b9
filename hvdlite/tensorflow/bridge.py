"""The one road from TensorFlow into the core: a stateful `tf.numpy_function` per bridge call.

`call` adds the op; its Python body (a `CallSite`, else `execute`) receives the inputs as numpy arrays, passes their
pointers to the core, waits for every handle and returns numpy outputs. Several collectives can
share one call (grouped ops, fused gradients): they are all enqueued before the first wait, so the core negotiates
and fuses them together and a rank never blocks on one while a peer blocks on another.

Inside a tf.function, stateful ops without resource inputs are chained in program order by TensorFlow's
automatic control dependencies, so every rank runs its bridge calls in the order the code wrote them. A graph
without them (tf.compat.v1, tf.Graph run by a Session) gets the same order from control dependencies that
`call` adds itself (_previous_collective).

The collectives' public wrappers are in mpi_ops; the object collectives and callbacks use the numpy-level
functions at the end of this file, which skip TensorFlow altogether.
"""

import json
import math
import re
import threading
from typing import List, Sequence

import numpy as np
import tensorflow as tf

from hvdlite.common import errors as hvd_errors
from hvdlite.common import ops
from hvdlite.common.basics import (
    OP_ALLGATHER,
    OP_ALLREDUCE,
    OP_ALLTOALL,
    OP_BARRIER,
    OP_BROADCAST,
    OP_JOIN,
    rank,
    size,
)
from hvdlite.tensorflow.errors import TF_ERRORS, XlaCompilationError, as_tf_error

SUPPORTED_DTYPES = (
    tf.uint8,
    tf.int8,
    tf.uint16,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.bool,
)


def _in_xla_context() -> bool:
    if tf.executing_eagerly():
        return False
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def check_not_xla(what: str) -> None:
    """Raises a clear error when called while tracing an XLA-compiled function (jit_compile=True): XLA cannot
    call into the core, and silently skipping the collective would train every rank alone."""
    if _in_xla_context():
        raise XlaCompilationError(
            f"hvdlite: {what} cannot run inside an XLA-compiled function (jit_compile=True): XLA cannot call "
            "the hvdlite core, and leaving the collective out would train each rank on its own. Use "
            "model.compile(..., jit_compile=False) (the default on CPU), or keep the collective outside the "
            "tf.function(jit_compile=True) (e.g. compute gradients in the XLA function and call "
            "DistributedGradientTape / the optimizer outside it)."
        )


class Collective:
    """One collective of a bridge call: everything the core needs besides the input array(s)."""

    __slots__ = (
        "op",
        "name",
        "reduce_op",
        "prescale",
        "postscale",
        "root_rank",
        "process_set_id",
        "with_splits",
        "hint",
        "in_place",
        "layout",
        "members",
    )

    def __init__(
        self,
        op,
        name=None,
        reduce_op=0,
        prescale=1.0,
        postscale=1.0,
        root_rank=-1,
        process_set_id=0,
        with_splits=False,
        hint="",
        in_place=False,
        layout=0,
        members=(),
    ):
        self.op, self.name, self.reduce_op = op, name, reduce_op
        self.prescale, self.postscale, self.root_rank = float(prescale), float(postscale), root_rank
        self.process_set_id, self.with_splits, self.hint = process_set_id, with_splits, hint
        # in_place: the input is a buffer that only this collective reads (a fusion buffer made by tf.concat):
        # allreduce/broadcast write the result into it and hand the same memory back to TensorFlow.
        self.in_place = in_place
        # layout: the digest of the tensors packed into the input (ops.layout_digest), which ranks must agree on;
        # members: those tensors as (name, shape, dtype name), to say which one differs when ranks disagree.
        self.layout, self.members = layout, tuple(members)

    @property
    def n_inputs(self) -> int:
        return 0 if self.op in (OP_BARRIER, OP_JOIN) else (2 if self.with_splits else 1)

    @property
    def n_outputs(self) -> int:
        return 2 if self.op == OP_ALLTOALL else 1


def _dtype_code(array: np.ndarray, name) -> int:
    subject = f"tensor '{name}'" if name else "an unnamed tensor"
    try:
        return ops.DTYPE_CODES[array.dtype.name]
    except KeyError:
        raise TF_ERRORS[hvd_errors.InvalidArgumentError](
            f"hvdlite: {subject} has dtype {array.dtype.name}, which hvdlite does not support; "
            f"supported: {', '.join(sorted(ops.DTYPE_CODES))}"
        ) from None


_ALIGN = 64  # TensorFlow adopts a returned numpy buffer without copying it when it is aligned to this


def _aligned_empty(shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def _owned_result(handle: int, dtype) -> np.ndarray:
    out = _aligned_empty(ops.output_shape(handle), dtype)
    if out.nbytes:
        ops.copy_output(handle, out.ctypes.data, out.nbytes)
    return out


def execute(collectives: Sequence[Collective], *arrays) -> List[np.ndarray]:
    """Enqueues every collective, then waits for all of them; returns the outputs in order (numpy in, numpy
    out, no TensorFlow here). This is the body of every bridge call and of the object collectives."""
    return finish(start(collectives, *arrays))


def start(collectives: Sequence[Collective], *arrays) -> list:
    """Enqueues every collective and returns what finish() needs, without waiting: for work that overlaps a
    collective with later steps (bounded staleness). The arrays must stay alive and unchanged until finish()."""
    # Everything is checked and described first, then queued in one atomic call: a rejected member must
    # not leave the others half-submitted (queued here while their peers wait for the rest).
    prepared = []  # (collective, request, input, output or None)
    position = 0
    for c in collectives:
        source = splits = None
        if c.n_inputs:
            source = np.asarray(arrays[position], order="C")  # keeps 0-d arrays 0-d
            if c.with_splits:
                splits = np.asarray(arrays[position + 1]).reshape(-1).tolist()
            position += c.n_inputs
        if c.op in (OP_BARRIER, OP_JOIN):
            prepared.append((c, ops.request(c.op, None, 0, (), 0, 0, process_set_id=c.process_set_id), None, None))
            continue
        if c.op in (OP_ALLGATHER, OP_ALLTOALL) and source.ndim == 0:
            source = source.reshape(1)
        output = None
        if c.op in (OP_ALLREDUCE, OP_BROADCAST):
            output = source if c.in_place and source.flags.writeable else _aligned_empty(source.shape, source.dtype)
        key = ops.request(
            c.op,
            c.name,
            _dtype_code(source, c.name),
            source.shape,
            source.ctypes.data,
            0 if output is None else output.ctypes.data,
            c.root_rank,
            c.reduce_op,
            c.prescale,
            c.postscale,
            c.process_set_id,
            splits,
        )
        prepared.append((c, key, source, output))
    try:
        handles = ops.submit_many([key for _, key, _, _ in prepared], [c.layout for c, _, _, _ in prepared])
    except hvd_errors.HvdliteError as e:
        raise as_tf_error(e) from None
    return [(c, h, source, output) for (c, _, source, output), h in zip(prepared, handles)]


def _member_mismatch(c: Collective, error: hvd_errors.MismatchError) -> hvd_errors.HvdliteError:
    """The error for packed members that ranks lay out differently. Every rank of the set got the core's error
    for the packed buffer c, so each gathers every rank's members and names the first that differs, the ranks and
    what differs, as the core names a tensor of its own; the core's error where the members agree."""
    stem = None if c.name is None else f"{c.name}.members"
    mine = json.dumps([rank(), [list(m) for m in c.members]]).encode()
    ranks = dict(json.loads(payload) for payload in allgather_bytes(mine, stem, c.process_set_id))

    def mismatch(what, subject, value):
        groups = {}
        for r in sorted(ranks):
            groups.setdefault(value(ranks[r]), []).append(r)
        described = "; ".join(
            f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {v}" for v, rs in groups.items()
        )
        return hvd_errors.MismatchError(f"Mismatched {what} for {subject}: {described}.")

    if len({len(m) for m in ranks.values()}) > 1:
        group = "an unnamed group" if c.name is None else f"group '{re.sub(r'[.]packed(?=[.]grad$|$)', '', c.name)}'"
        return mismatch("numbers of tensors", group, len)
    for i, (name, _, _) in enumerate(c.members):
        subject = f"tensor '{name}'" if name else f"tensor {i} of those packed together"
        for what, field in (("data types", 2), ("shapes", 1)):
            if len({str(m[i][field]) for m in ranks.values()}) > 1:
                return mismatch(what, subject, lambda m, i=i, field=field: str(m[i][field]))
    return error


def finish(pending: list) -> List[np.ndarray]:
    """Waits for what start() enqueued; returns the outputs in order."""
    failed = None  # (collective, error) of the first that failed
    try:
        for c, handle, _, _ in pending:  # wait for all, even after a failure: the core may still use our buffers
            try:
                ops.wait(handle)
            except hvd_errors.HvdliteError as e:
                failed = failed or (c, e)
    except BaseException:  # interrupted (Ctrl-C, a signal handler): the buffers stay alive until the core is done
        ops.abandon([handle for _, handle, _, _ in pending], keep_alive=pending)
        raise
    try:
        if failed is not None:
            c, e = failed
            if c.members and isinstance(e, hvd_errors.MismatchError):
                e = _member_mismatch(c, e)
            raise as_tf_error(e, c.hint)
        results = []
        for c, handle, source, output in pending:
            if c.op == OP_JOIN:
                results.append(np.int32(ops.int_results(handle)[0]))
            elif c.op == OP_BARRIER:
                continue
            elif output is not None:
                results.append(output)
            else:
                results.append(_owned_result(handle, source.dtype))
                if c.op == OP_ALLTOALL:
                    results.append(np.asarray(ops.int_results(handle), dtype=np.int32))
        return results
    finally:
        for _, handle, _, _ in pending:
            ops.release(handle)


class CallSite:
    """The body of one bridge call (what tf.numpy_function runs), executed step after step with new arrays of the
    same dtypes and shapes. Allreduce and broadcast of named tensors, whose outputs have their inputs' shapes, keep
    their C requests by input signature and write only the buffer addresses per call (ops.PreparedBatch): a
    single collective costs one call into the core when it finishes within a wait slice. Everything else, and a
    call made while another thread runs this site, takes the general path (execute)."""

    __slots__ = ("collectives", "in_place", "_templates", "_busy")
    _TEMPLATE_LIMIT = 16  # signatures kept per site: a site whose shapes change every call rebuilds instead

    def __init__(self, collectives: Sequence[Collective]):
        self.collectives = tuple(collectives)
        fixed = all(c.op in (OP_ALLREDUCE, OP_BROADCAST) and c.name and not c.with_splits for c in self.collectives)
        self.in_place = tuple(c.in_place for c in self.collectives) if fixed and self.collectives else None
        self._templates = {}  # ((dtype, shape) per input) -> (ops.PreparedBatch, output layout, its bytes)
        self._busy = threading.Lock()

    def __call__(self, *arrays) -> List[np.ndarray]:
        if self.in_place is None or not self._busy.acquire(blocking=False):
            return execute(self.collectives, *arrays)
        try:
            return self._run(arrays)
        finally:
            self._busy.release()

    def _run(self, arrays) -> List[np.ndarray]:
        sources = [np.asarray(a, order="C") for a in arrays]
        signature = tuple((s.dtype, s.shape) for s in sources)
        entry = self._templates.get(signature)
        if entry is None:
            entry = self._build(sources, signature)
        templates, layout, total = entry
        # The outputs of the collectives that do not reduce in place share one allocation, each aligned.
        block = base = None
        if total is not None:
            block = np.empty(total + _ALIGN, dtype=np.uint8)
            base = (-block.ctypes.data) % _ALIGN
        outputs = []
        for in_place, source, slot in zip(self.in_place, sources, layout):
            if in_place and source.flags.writeable:
                outputs.append(source)
            elif slot is None:  # an in-place member whose input TensorFlow gave read-only
                outputs.append(_aligned_empty(source.shape, source.dtype))
            else:
                start = base + slot
                outputs.append(block[start : start + source.nbytes].view(source.dtype).reshape(source.shape))
        keep_alive = (sources, outputs)
        try:
            handles = templates.start(list(zip(sources, outputs)), keep_alive)
        except hvd_errors.HvdliteError as e:
            raise as_tf_error(e) from None
        if not handles:
            return outputs
        try:
            released = ops.wait_release_all(handles)
        except BaseException:
            ops.abandon(handles, keep_alive)
            raise
        if not released:  # failed, or still running after a slice: wait on each, naming the one that failed
            finish([(c, h, s, o) for c, h, s, o in zip(self.collectives, handles, sources, outputs)])
        return outputs

    def _build(self, sources, signature):
        requests = [
            ops.request(
                c.op,
                c.name,
                _dtype_code(s, c.name),
                s.shape,
                0,
                0,
                c.root_rank,
                c.reduce_op,
                c.prescale,
                c.postscale,
                c.process_set_id,
            )
            for c, s in zip(self.collectives, sources)
        ]
        layout, total = [], 0  # each output's offset in the shared allocation (None: reduced in place)
        for in_place, source in zip(self.in_place, sources):
            layout.append(None if in_place else total)
            if not in_place:
                total += -(-source.nbytes // _ALIGN) * _ALIGN
        if all(slot is None for slot in layout):
            total = None
        entry = (ops.PreparedBatch(requests, [c.layout for c in self.collectives]), layout, total)
        if len(self._templates) >= self._TEMPLATE_LIMIT:
            self._templates.clear()
        self._templates[signature] = entry
        return entry


# Ops whose evaluation needs a feed (placeholders of a graph run by a Session) or consumes input (iterators,
# queues, readers): the ordering below never makes a collective depend on one it would not read anyway.
_INPUT_OPS = frozenset(
    {
        "Placeholder",
        "PlaceholderV2",
        "IteratorGetNext",
        "IteratorGetNextSync",
        "IteratorGetNextAsOptional",
        "QueueDequeue",
        "QueueDequeueV2",
        "QueueDequeueMany",
        "QueueDequeueManyV2",
        "QueueDequeueUpTo",
        "QueueDequeueUpToV2",
        "ReaderRead",
        "ReaderReadV2",
        "ReaderReadUpTo",
        "ReaderReadUpToV2",
    }
)


def _reads_input(op) -> bool:
    if op.type in ("Placeholder", "PlaceholderV2") and op.graph.building_function:
        return False  # a function's arguments, not something a run feeds
    return op.type in _INPUT_OPS


def _graph_attribute(graph, name, make):
    value = getattr(graph, name, None)
    if value is None:
        value = make()
        setattr(graph, name, value)
    return value


def _input_ops(graph, tensors) -> frozenset:
    """The input-reading ops (_INPUT_OPS) among the ancestors of tensors, memoised per op on the graph."""
    memo = _graph_attribute(graph, "_hvdlite_input_ops", dict)
    entered = set()

    def parents(op):
        return [t.op for t in op.inputs] + list(op.control_inputs)

    stack = [(t.op, False) for t in tensors]
    while stack:
        op, finished = stack.pop()
        if finished:
            found = frozenset().union(*(memo.get(p, frozenset()) for p in parents(op)))
            memo[op] = found | {op} if _reads_input(op) else found
            continue
        if op in memo or op in entered:
            continue
        entered.add(op)
        stack.append((op, True))
        stack.extend((p, False) for p in parents(op) if p not in memo and p not in entered)
    return frozenset().union(*(memo[t.op] for t in tensors))


def _previous_collective(graph, inputs):
    """The collective a new one must wait for in a graph without automatic control dependencies, and where to
    record the new one.

    Each collective is a blocking op, and TensorFlow's executor runs independent ops in any order on its
    inter-op threads: two ranks can block in different collectives, each waiting for the other, until the
    stall shutdown (Horovod's kernels are asynchronous and hold no thread while waiting). Inside tf.function,
    automatic control dependencies run stateful ops in program order; a tf.compat.v1 graph or tf.Graph gets
    the same order here, from a control dependency on the newest earlier collective of the same graph and
    control-flow context. A run that evaluates a collective therefore also evaluates the one it waits for, so
    that one must read no input this one does not (see _INPUT_OPS): the order never makes a run need a feed,
    or consume data, that only an unrelated collective would. Collectives reading different inputs stay
    unordered, as before.
    """
    if tf.executing_eagerly() or graph._add_control_dependencies:
        return [], None, None
    demands = _input_ops(graph, inputs)
    chain = _graph_attribute(graph, "_hvdlite_collectives", dict).setdefault(graph._get_control_flow_context(), [])
    for op, earlier in reversed(chain):
        if earlier <= demands:
            return [op], chain, demands
    return [], chain, demands


def call(
    collectives: Sequence[Collective],
    inputs: Sequence[tf.Tensor],
    out_dtypes,
    out_shapes,
    what: str = "hvdlite collective",
) -> List[tf.Tensor]:
    """Runs collectives through one stateful tf.numpy_function (eager or graph); returns the output tensors."""
    check_not_xla(what)
    inputs = list(inputs)
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    after, chain, demands = _previous_collective(graph, inputs) if graph is not None else ([], None, None)
    with tf.control_dependencies(after):
        outputs = tf.numpy_function(
            CallSite(collectives),
            inputs,
            list(out_dtypes),
            stateful=True,
            name="HvdliteCollective",
        )
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    outputs = list(outputs)
    if chain is not None:
        chain.append((outputs[0] if isinstance(outputs[0], tf.Operation) else outputs[0].op, demands))
    for tensor, shape in zip(outputs, out_shapes):
        tensor.set_shape(shape)
    return outputs


def process_set_id(process_set) -> int:
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered; call hvd.add_process_set first")
    return process_set.process_set_id


def process_set_size(process_set) -> int:
    return size() if process_set.process_set_id == 0 else len(process_set.ranks)


def process_set_rank(process_set) -> int:
    return rank() if process_set.process_set_id == 0 else process_set.ranks.index(rank())


def check_dtype(tensor: tf.Tensor, name) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TF_ERRORS[hvd_errors.InvalidArgumentError](
            f"hvdlite: tensor {name or ''} has dtype {tensor.dtype.name}, which hvdlite does not support; "
            f"supported: {', '.join(d.name for d in SUPPORTED_DTYPES)}"
        )


def np_broadcast(array: np.ndarray, root_rank: int, name: str, process_set) -> np.ndarray:
    return execute(
        (Collective(OP_BROADCAST, name, root_rank=int(root_rank), process_set_id=process_set_id(process_set)),),
        array,
    )[0]


def allgather_bytes(payload: bytes, name, set_id: int) -> List[bytes]:
    """Every rank's payload, in rank order of the set: an allgather of the lengths, then one of the bytes.
    name None: unnamed, so the calls are told apart by their order."""
    lengths, gathered = (
        execute(
            (Collective(OP_ALLGATHER, None if name is None else f"{name}.{part}", process_set_id=set_id),), array
        )[0]
        for part, array in (
            ("length", np.array([len(payload)], dtype=np.int64)),
            ("data", np.frombuffer(payload, dtype=np.uint8)),
        )
    )
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    return [gathered[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(lengths))]


def np_allreduce(array: np.ndarray, name: str, op, process_set) -> np.ndarray:
    return execute(
        (Collective(OP_ALLREDUCE, name, ops.core_reduce_op(op), process_set_id=process_set_id(process_set)),), array
    )[0]
