"""TensorFlow collectives with horovod.tensorflow's names and semantics, eager and inside tf.function.

Nothing is compiled against TensorFlow. Every collective goes through one bridge, `_bridge`: a stateful
`tf.numpy_function` whose Python body (`_execute`) receives the inputs as numpy arrays, passes their pointers to
the core (hvdlite.common.ops.submit_many), waits for every handle and returns numpy outputs. Several collectives can
share one bridge call (grouped ops, fused gradients): they are all enqueued before the first wait, so the core
negotiates and fuses them together and a rank never blocks on one while a peer blocks on another.

Inside a tf.function, stateful ops without resource inputs are chained in program order by TensorFlow's
automatic control dependencies, so every rank runs its bridge calls in the order the code wrote them. A graph
without them (tf.compat.v1, tf.Graph run by a Session) gets the same order from control dependencies that
_bridge adds itself (_previous_collective).

Gradients are registered for allreduce, grouped_allreduce, allgather, broadcast, alltoall and reducescatter with
tf.custom_gradient. Errors reach the caller as classes that are both the tf.errors class and the hvdlite one,
eagerly and inside tf.function (hvdlite/tensorflow/errors.py).
"""

import functools
import re
import warnings
from typing import List, Optional, Sequence

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
    OP_REDUCESCATTER,
    global_process_set,
    rank,
)
from hvdlite.common.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - public constants
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.errors import TF_ERRORS, XlaCompilationError, as_tf_error  # noqa: F401 - public class

_SUPPORTED = (
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


# --------------------------------------------------------------------------- XLA


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


# --------------------------------------------------------------------------- the bridge


class _Collective:
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
    ):
        self.op, self.name, self.reduce_op = op, name, reduce_op
        self.prescale, self.postscale, self.root_rank = float(prescale), float(postscale), root_rank
        self.process_set_id, self.with_splits, self.hint = process_set_id, with_splits, hint
        # in_place: the input is a buffer that only this collective reads (a fusion buffer made by tf.concat):
        # allreduce/broadcast write the result into it and hand the same memory back to TensorFlow.
        self.in_place = in_place

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
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def _owned_result(handle: int, dtype) -> np.ndarray:
    out = _aligned_empty(ops.output_shape(handle), dtype)
    if out.nbytes:
        ops.copy_output(handle, out.ctypes.data, out.nbytes)
    return out


def _execute(collectives: Sequence[_Collective], *arrays) -> List[np.ndarray]:
    """Enqueues every collective, then waits for all of them; returns the outputs in order (numpy in, numpy
    out, no TensorFlow here). This is the body of every bridge call and of the object collectives."""
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
        handles = ops.submit_many([key for _, key, _, _ in prepared])
    except hvd_errors.HvdliteError as e:
        raise as_tf_error(e) from None
    pending = [(c, h, source, output) for (c, _, source, output), h in zip(prepared, handles)]
    error = None
    try:
        for c, handle, _, _ in pending:  # wait for all, even after a failure: the core may still use our buffers
            try:
                ops.wait(handle)
            except hvd_errors.HvdliteError as e:
                error = error or as_tf_error(e, c.hint)
    except BaseException:  # interrupted (Ctrl-C, a signal handler): the buffers stay alive until the core is done
        ops.abandon([handle for _, handle, _, _ in pending], keep_alive=pending)
        raise
    try:
        if error is not None:
            raise error
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


def _bridge(
    collectives: Sequence[_Collective],
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
            functools.partial(_execute, tuple(collectives)),
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


# --------------------------------------------------------------------------- helpers


def _normalize_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _op_name(prefix: str, tensor, name: Optional[str], ignore_name_scope: bool) -> Optional[str]:
    """Names identical on every rank. Eagerly: the given name, or None (the core numbers unnamed ops, which
    agree when ranks issue them in the same order). Inside a graph: the given name under the current name scope
    (unless ignore_name_scope), else `<prefix>.<function>.<n>` for the n-th unnamed collective traced in the
    outermost function. Graph tensor names cannot be used as Horovod does: captured tensors are named after
    process-local ids and differ between ranks."""
    if tf.executing_eagerly():
        return name
    graph = tf.compat.v1.get_default_graph()
    if name is not None:
        scope = "" if ignore_name_scope else graph.get_name_scope()
        return f"{scope}/{name}" if scope else name
    outer = graph
    while getattr(outer, "outer_graph", None) is not None and hasattr(outer.outer_graph, "outer_graph"):
        outer = outer.outer_graph
    count = getattr(outer, "_hvdlite_unnamed", 0)
    outer._hvdlite_unnamed = count + 1
    return f"{prefix}.{_normalize_name(getattr(outer, 'name', 'graph'))}.{count}"


def _process_set_id(process_set) -> int:
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered; call hvd.add_process_set first")
    return process_set.process_set_id


def _process_set_size(process_set) -> int:
    from hvdlite.common.basics import size

    return size() if process_set.process_set_id == 0 else len(process_set.ranks)


def _process_set_rank(process_set) -> int:
    return rank() if process_set.process_set_id == 0 else process_set.ranks.index(rank())


def _check_dtype(tensor: tf.Tensor, name) -> None:
    if tensor.dtype not in _SUPPORTED:
        raise TF_ERRORS[hvd_errors.InvalidArgumentError](
            f"hvdlite: tensor {name or ''} has dtype {tensor.dtype.name}, which hvdlite does not support; "
            f"supported: {', '.join(d.name for d in _SUPPORTED)}"
        )


def _resolve_op(op, average, default=Average):
    """Horovod's handling of the deprecated `average` argument: op wins, both is an error, average alone warns."""
    if average is not None:
        if op is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        warnings.warn("Parameter `average` has been replaced with `op`", DeprecationWarning, stacklevel=3)
        op = Average if average else Sum
    op = default if op is None else op
    ops.core_reduce_op(op)  # validates
    return op


def _group_names(name: Optional[str], count: int):
    return [None] * count if name is None else [f"{name}.{i}" for i in range(count)]


def _to_tensors(tensors):
    return [tf.convert_to_tensor(t) for t in tensors]


# --------------------------------------------------------------------------- allreduce


def _allreduce_scale(op, prescale, postscale, process_set):
    return (1.0 / _process_set_size(process_set) if op == Average else 1.0) * prescale * postscale


def _grouped_allreduce_raw(tensors, names, op, prescale, postscale, process_set, what="allreduce"):
    """Differentiable allreduce of several dense tensors in one bridge call (the core fuses them)."""
    ps_id = _process_set_id(process_set)
    reduce_op = ops.core_reduce_op(op)

    @tf.custom_gradient
    def forward(*xs):
        collectives = [
            _Collective(OP_ALLREDUCE, n, reduce_op, prescale, postscale, process_set_id=ps_id) for n in names
        ]
        outs = _bridge(collectives, xs, [x.dtype for x in xs], [x.shape for x in xs], what)

        def grad(*dys):
            if op not in (Average, Sum):
                raise NotImplementedError(
                    f"hvdlite: the gradient of allreduce with op={op} is not defined; use op=Average or op=Sum"
                )
            dys = [tf.zeros_like(x) if dy is None else tf.convert_to_tensor(dy) for x, dy in zip(xs, dys)]
            grad_names = [None if n is None else f"{n}.grad" for n in names]
            back = [
                _Collective(OP_ALLREDUCE, n, reduce_op, prescale, postscale, process_set_id=ps_id) for n in grad_names
            ]
            return _bridge(back, dys, [d.dtype for d in dys], [d.shape for d in dys], f"gradient of {what}")

        return outs, grad

    return list(forward(*tensors))


def _check_sparse(op, prescale, postscale) -> None:
    """horovod.tensorflow's limits for IndexedSlices, checked before any collective is issued."""
    if op not in (Average, Sum):
        raise NotImplementedError(
            "Only Sum and Average ops are supported with tf.IndexedSlices (pass "
            "sparse_as_dense=True, or convert them with tf.convert_to_tensor)"
        )
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")


def _sparse_allreduce(slices: Sequence[tf.IndexedSlices], names, op, process_set) -> List[tf.IndexedSlices]:
    """IndexedSlices as Horovod reduces them: every rank's values and indices gathered (all in one call), and
    for Average the values divided by the set size with `/`, so integer values become floats as in Horovod."""
    tensors, gather_names = [], []
    for s, name in zip(slices, names):
        _check_dtype(s.values, name)
        tensors += [s.values, s.indices]
        gather_names += [None if name is None else f"{name}.values", None if name is None else f"{name}.indices"]
    gathered = _grouped_allgather_raw(tensors, gather_names, process_set)
    results = []
    for k, s in enumerate(slices):
        values, indices = gathered[2 * k], gathered[2 * k + 1]
        if op == Average:
            values = tf.math.truediv(values, tf.cast(_process_set_size(process_set), values.dtype))
        results.append(tf.IndexedSlices(values, indices, dense_shape=s.dense_shape))
    return results


def allreduce(
    tensor,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
):
    """Reduces tensor over the ranks of process_set (default op: Average). IndexedSlices are allgathered
    (values and indices) and, for Average, their values divided by the set size. Differentiable."""
    op = _resolve_op(op, average)
    compression = compression or Compression.none
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse(op, prescale_factor, postscale_factor)
        return _sparse_allreduce(
            [tensor], [_op_name("HorovodAllgather", tensor.values, name, ignore_name_scope)], op, process_set
        )[0]
    tensor = tf.convert_to_tensor(tensor)
    name = _op_name("HorovodAllreduce", tensor, name, ignore_name_scope)
    wire, ctx = compression.compress(tensor)
    _check_dtype(wire, name)
    result = _grouped_allreduce_raw([wire], [name], op, prescale_factor, postscale_factor, process_set)[0]
    return compression.decompress(result, ctx)


def grouped_allreduce(
    tensors,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    ignore_name_scope=False,
    name=None,
):
    """Allreduces a list of tensors in one call (fused by the core); IndexedSlices among them as allreduce
    does, in one allgather call for all of them. Differentiable."""
    op = _resolve_op(op, average)
    compression = compression or Compression.none
    tensors = list(tensors)
    if not tensors:
        return []
    results = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse(op, prescale_factor, postscale_factor)
    values = {i: tensors[i].values if i in sparse else tf.convert_to_tensor(tensors[i]) for i in range(len(tensors))}
    compressed = {i: compression.compress(values[i]) for i in dense}
    names = {
        i: _op_name(
            "HorovodGroupedAllreduce",
            compressed[i][0] if i in compressed else values[i],
            None if name is None else f"{name}.{i}",
            ignore_name_scope,
        )
        for i in range(len(tensors))
    }  # in list order: graph names count up the same way on every rank
    if sparse:
        for i, reduced in zip(
            sparse, _sparse_allreduce([tensors[i] for i in sparse], [names[i] for i in sparse], op, process_set)
        ):
            results[i] = reduced
    if dense:
        for i in dense:
            _check_dtype(compressed[i][0], names[i])
        reduced = _grouped_allreduce_raw(
            [compressed[i][0] for i in dense],
            [names[i] for i in dense],
            op,
            prescale_factor,
            postscale_factor,
            process_set,
            "grouped_allreduce",
        )
        for i, r in zip(dense, reduced):
            results[i] = compression.decompress(r, compressed[i][1])
    return results


# --------------------------------------------------------------------------- allgather


def _gathered_shape(x) -> tf.TensorShape:
    """Static shape of an allgather's (or alltoall's) output: dimension 0 unknown, a scalar becomes a vector,
    nothing is known when the input's rank is not."""
    if x.shape.rank is None:
        return tf.TensorShape(None)
    return tf.TensorShape([None]).concatenate(x.shape[1:])


def _grouped_allgather_raw(tensors, names, process_set):
    ps_id = _process_set_id(process_set)
    tensors = _to_tensors(tensors)

    @tf.custom_gradient
    def forward(*xs):
        collectives = [_Collective(OP_ALLGATHER, n, process_set_id=ps_id) for n in names]
        outs = _bridge(collectives, xs, [x.dtype for x in xs], [_gathered_shape(x) for x in xs], "allgather")

        def grad(*dys):
            # Horovod's rule: the gradient averaged over the set, then this rank's rows (torch.distributed.nn
            # would sum; hvdlite.torch follows Horovod too).
            # Dimension 0, or 1 for a scalar (sent as one row); decided at run time for a tensor of unknown rank.
            rows = [tf.concat([tf.shape(x, out_type=tf.int64), tf.ones([1], tf.int64)], 0)[:1] for x in xs]
            dys = [tf.zeros_like(o) if dy is None else tf.convert_to_tensor(dy) for o, dy in zip(outs, dys)]
            back = [
                _Collective(OP_ALLGATHER, None if n is None else f"{n}.grad.rows", process_set_id=ps_id)
                for n in names
            ] + [
                _Collective(
                    OP_ALLREDUCE,
                    None if n is None else f"{n}.grad",
                    ops.core_reduce_op(Average),
                    process_set_id=ps_id,
                )
                for n in names
            ]
            results = _bridge(
                back,
                rows + dys,
                [tf.int64] * len(xs) + [d.dtype for d in dys],
                [tf.TensorShape([None])] * len(xs) + [d.shape for d in dys],
                "gradient of allgather",
            )
            me = _process_set_rank(process_set)
            grads = []
            for x, all_rows, averaged in zip(xs, results[: len(xs)], results[len(xs) :]):
                offset = tf.reduce_sum(all_rows[:me])
                mine = averaged[offset : offset + all_rows[me]]
                grads.append(tf.reshape(mine, tf.shape(x)))
            return grads

        return outs, grad

    return list(forward(*tensors))


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates every rank's tensor along dimension 0 (first dimensions may differ). Differentiable."""
    tensor = tf.convert_to_tensor(tensor)
    name = _op_name("HorovodAllgather", tensor, name, ignore_name_scope)
    _check_dtype(tensor, name)
    return _grouped_allgather_raw([tensor], [name], process_set)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    tensors = _to_tensors(tensors)
    names = [
        _op_name("HorovodGroupedAllgather", t, n, ignore_name_scope)
        for t, n in zip(tensors, _group_names(name, len(tensors)))
    ]
    for t, n in zip(tensors, names):
        _check_dtype(t, n)
    return _grouped_allgather_raw(tensors, names, process_set) if tensors else []


# --------------------------------------------------------------------------- broadcast


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns root_rank's tensor on every rank of process_set (root_rank is a global rank). Differentiable, with
    Horovod's gradient: every rank's gradient averaged, on the root; zero elsewhere."""
    tensor = tf.convert_to_tensor(tensor)
    name = _op_name("HorovodBroadcast", tensor, name, ignore_name_scope)
    _check_dtype(tensor, name)
    ps_id = _process_set_id(process_set)
    root_rank = int(root_rank)

    @tf.custom_gradient
    def forward(x):
        out = _bridge(
            [_Collective(OP_BROADCAST, name, root_rank=root_rank, process_set_id=ps_id)],
            [x],
            [x.dtype],
            [x.shape],
            "broadcast",
        )[0]

        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            averaged = _bridge(
                [
                    _Collective(
                        OP_ALLREDUCE,
                        None if name is None else f"{name}.grad",
                        ops.core_reduce_op(Average),
                        process_set_id=ps_id,
                    )
                ],
                [dy],
                [dy.dtype],
                [dy.shape],
                "gradient of broadcast",
            )[0]
            if rank() == root_rank:
                return averaged
            # The zeros must depend on the allreduce: a tf.compat.v1 Session would otherwise prune it from this
            # rank's run while the root waits in it.
            with tf.control_dependencies([averaged]):
                return tf.zeros_like(averaged)

        return out, grad

    return forward(tensor)


# --------------------------------------------------------------------------- alltoall / reducescatter


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends splits[i] rows of tensor to rank i of the set. Returns the received rows concatenated in rank order
    and, as in Horovod, only when splits is given, also the received splits (int32): (output, received_splits).
    Without splits, dimension 0 is divided evenly. Differentiable."""
    tensor = tf.convert_to_tensor(tensor)
    name = _op_name("HorovodAlltoall", tensor, name, ignore_name_scope)
    _check_dtype(tensor, name)
    ps_id = _process_set_id(process_set)
    shape = _gathered_shape(tensor)

    def run(x, s, op_name, what):
        inputs = [x] if s is None else [x, tf.cast(s, tf.int32)]
        return _bridge(
            [_Collective(OP_ALLTOALL, op_name, process_set_id=ps_id, with_splits=s is not None)],
            inputs,
            [x.dtype, tf.int32],
            [shape, tf.TensorShape([None])],
            what,
        )

    @tf.custom_gradient
    def forward(x):
        out, received = run(x, splits, name, "alltoall")

        def grad(dy, _unused=None):
            back, _ = run(
                tf.convert_to_tensor(dy), received, None if name is None else f"{name}.grad", "gradient of alltoall"
            )
            return tf.reshape(back, tf.shape(x))

        return (out, received), grad

    out, received = forward(tensor)
    return out if splits is None else (out, tf.stop_gradient(received))


def _grouped_reducescatter_raw(tensors, names, op, prescale, postscale, process_set):
    ps_id = _process_set_id(process_set)
    reduce_op = ops.core_reduce_op(op)

    @tf.custom_gradient
    def forward(*xs):
        collectives = [
            _Collective(OP_REDUCESCATTER, n, reduce_op, prescale, postscale, process_set_id=ps_id) for n in names
        ]
        shapes = [tf.TensorShape([None]).concatenate(x.shape[1:]) for x in xs]
        outs = _bridge(collectives, xs, [x.dtype for x in xs], shapes, "reducescatter")

        def grad(*dys):
            if op not in (Average, Sum):
                raise NotImplementedError(f"hvdlite: the gradient of reducescatter with op={op} is not defined")
            dys = [tf.convert_to_tensor(dy) for dy in dys]
            back = [
                _Collective(OP_ALLGATHER, None if n is None else f"{n}.grad", process_set_id=ps_id) for n in names
            ]
            gathered = _bridge(back, dys, [d.dtype for d in dys], [x.shape for x in xs], "gradient of reducescatter")
            # Horovod's rule: the gathered gradient times the set size for Sum (1 for Average), times the factors.
            scale = (_process_set_size(process_set) if op == Sum else 1.0) * prescale * postscale
            return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in gathered]

        return outs, grad

    return list(forward(*tensors))


def reducescatter(
    tensor,
    device_dense="",
    compression=Compression.none,
    op=Average,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Reduces tensor over the ranks and returns this rank's slice of dimension 0 (earlier ranks get the extra
    rows when it does not divide evenly). Differentiable."""
    compression = compression or Compression.none
    op = _resolve_op(op, None)
    tensor = tf.convert_to_tensor(tensor)
    name = _op_name("HorovodReducescatter", tensor, name, ignore_name_scope)
    wire, ctx = compression.compress(tensor)
    _check_dtype(wire, name)
    result = _grouped_reducescatter_raw([wire], [name], op, prescale_factor, postscale_factor, process_set)[0]
    return compression.decompress(result, ctx)


def grouped_reducescatter(
    tensors,
    device_dense="",
    compression=Compression.none,
    op=Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
    ignore_name_scope=False,
    name=None,
):
    """Reducescatters a list of tensors in one call (Horovod's positional order; `ignore_name_scope` and `name`
    are hvdlite additions, after Horovod's parameters). Differentiable."""
    compression = compression or Compression.none
    op = _resolve_op(op, None)
    tensors = _to_tensors(tensors)
    if not tensors:
        return []
    compressed = [compression.compress(t) for t in tensors]
    wires = [w for w, _ in compressed]
    names = [
        _op_name("HorovodGroupedReducescatter", w, n, ignore_name_scope)
        for w, n in zip(wires, _group_names(name, len(wires)))
    ]
    for w, n in zip(wires, names):
        _check_dtype(w, n)
    results = _grouped_reducescatter_raw(wires, names, op, prescale_factor, postscale_factor, process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed)]


# --------------------------------------------------------------------------- synchronisation


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called barrier (an op inside a tf.function)."""
    _bridge([_Collective(OP_BARRIER, process_set_id=_process_set_id(process_set))], [], [], [], "barrier")


def join(device="") -> tf.Tensor:
    """Declares that this rank has no more data. Until every rank has joined, this rank takes part in other
    ranks' allreduces with zeros (allgathers with no rows). Returns the last rank to join (int32 tensor)."""
    return _bridge([_Collective(OP_JOIN)], [], [tf.int32], [tf.TensorShape([])], "join")[0]


# --------------------------------------------------------------------------- numpy-level (object collectives)


def _np_broadcast(array: np.ndarray, root_rank: int, name: str, process_set) -> np.ndarray:
    return _execute(
        (_Collective(OP_BROADCAST, name, root_rank=int(root_rank), process_set_id=_process_set_id(process_set)),),
        array,
    )[0]


def _np_allgather(array: np.ndarray, name: str, process_set) -> np.ndarray:
    return _execute((_Collective(OP_ALLGATHER, name, process_set_id=_process_set_id(process_set)),), array)[0]


def _np_allreduce(array: np.ndarray, name: str, op, process_set) -> np.ndarray:
    return _execute(
        (_Collective(OP_ALLREDUCE, name, ops.core_reduce_op(op), process_set_id=_process_set_id(process_set)),), array
    )[0]
