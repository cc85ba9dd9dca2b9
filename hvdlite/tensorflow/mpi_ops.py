"""TensorFlow collectives with horovod.tensorflow's names and semantics, eager and inside tf.function.

Nothing is compiled against TensorFlow: every wrapper here describes its collectives and runs them through one
bridge call (hvdlite/tensorflow/bridge.py). Gradients are registered for allreduce, grouped_allreduce, allgather,
broadcast, alltoall and reducescatter with tf.custom_gradient. Errors reach the caller as classes that are both
the tf.errors class and the hvdlite one, eagerly and inside tf.function (hvdlite/tensorflow/errors.py).
"""

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
from hvdlite.tensorflow import bridge
from hvdlite.tensorflow.bridge import check_not_xla  # noqa: F401 - public
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.errors import TF_ERRORS, XlaCompilationError, as_tf_error  # noqa: F401 - public class

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
    return (1.0 / bridge.process_set_size(process_set) if op == Average else 1.0) * prescale * postscale


def _grouped_allreduce_raw(tensors, names, op, prescale, postscale, process_set, what="allreduce", packed_name=None):
    """Differentiable allreduce of several dense tensors in one bridge call. Two or more whose shapes are known
    when traced travel packed, as one operation (_reduce_packed)."""
    ps_id = bridge.process_set_id(process_set)
    reduce_op = ops.core_reduce_op(op)
    packed = len(tensors) > 1 and op != Adasum and all(t.shape.is_fully_defined() for t in tensors)

    def reduce(xs, names, packed_name, what):
        def collective(name, **packing):
            return bridge.Collective(
                OP_ALLREDUCE, name, reduce_op, prescale, postscale, process_set_id=ps_id, **packing
            )

        if not packed:
            return bridge.call([collective(n) for n in names], xs, [x.dtype for x in xs], [x.shape for x in xs], what)
        return _reduce_packed(xs, names, packed_name, collective, what)

    @tf.custom_gradient
    def forward(*xs):
        outs = reduce(xs, names, packed_name, what)

        def grad(*dys):
            if op not in (Average, Sum):
                raise NotImplementedError(
                    f"hvdlite: the gradient of allreduce with op={op} is not defined; use op=Average or op=Sum"
                )
            dys = [tf.zeros_like(x) if dy is None else tf.convert_to_tensor(dy) for x, dy in zip(xs, dys)]
            grad_names = [None if n is None else f"{n}.grad" for n in names]
            return reduce(
                dys, grad_names, None if packed_name is None else f"{packed_name}.grad", f"gradient of {what}"
            )

        return outs, grad

    return list(forward(*tensors))


def _reduce_packed(xs, names, packed_name, collective, what):
    """Allreduces tensors of known shapes as one operation: concatenated into one buffer, reduced, split again.
    The operation carries the digest of the members' shapes, which the core compares across ranks as it compares
    shapes; where ranks disagree, the error names the member that differs (bridge._member_mismatch). Members of
    several dtypes cannot share a buffer: an empty operation whose digest includes the dtypes goes first, then
    the members one by one."""
    shapes = [x.shape.as_list() for x in xs]
    dtypes = [x.dtype for x in xs]
    members = [(n, s, d.name) for n, s, d in zip(names, shapes, dtypes)]
    if all(d == dtypes[0] for d in dtypes):
        flat = tf.concat([tf.reshape(x, [-1]) for x in xs], axis=0)
        packed_op = collective(packed_name, in_place=True, layout=ops.layout_digest(shapes), members=members)
        (reduced,) = bridge.call([packed_op], [flat], [flat.dtype], [flat.shape], what)
        pieces = tf.split(reduced, [x.shape.num_elements() for x in xs])
        return [tf.reshape(p, s) for p, s in zip(pieces, shapes)]
    marker = tf.zeros([0], dtype=dtypes[0])
    digest = ops.layout_digest(shapes, [d.name for d in dtypes])
    (agreed,) = bridge.call(
        [collective(packed_name, layout=digest, members=members)], [marker], [dtypes[0]], [[0]], what
    )
    with tf.control_dependencies([agreed]):  # every rank has these dtypes: the members go one by one
        return bridge.call([collective(n) for n in names], xs, dtypes, [x.shape for x in xs], what)


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
        bridge.check_dtype(s.values, name)
        tensors += [s.values, s.indices]
        gather_names += [None if name is None else f"{name}.values", None if name is None else f"{name}.indices"]
    gathered = _grouped_allgather_raw(tensors, gather_names, process_set)
    results = []
    for k, s in enumerate(slices):
        values, indices = gathered[2 * k], gathered[2 * k + 1]
        if op == Average:
            values = tf.math.truediv(values, tf.cast(bridge.process_set_size(process_set), values.dtype))
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
    bridge.check_dtype(wire, name)
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
            bridge.check_dtype(compressed[i][0], names[i])
        group = _op_name("HorovodGroupedAllreduce", values[dense[0]], name, ignore_name_scope)
        reduced = _grouped_allreduce_raw(
            [compressed[i][0] for i in dense],
            [names[i] for i in dense],
            op,
            prescale_factor,
            postscale_factor,
            process_set,
            "grouped_allreduce",
            None if group is None else f"{group}.packed",
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
    ps_id = bridge.process_set_id(process_set)
    tensors = _to_tensors(tensors)

    @tf.custom_gradient
    def forward(*xs):
        collectives = [bridge.Collective(OP_ALLGATHER, n, process_set_id=ps_id) for n in names]
        outs = bridge.call(collectives, xs, [x.dtype for x in xs], [_gathered_shape(x) for x in xs], "allgather")

        def grad(*dys):
            # Horovod's rule: the gradient averaged over the set, then this rank's rows (torch.distributed.nn
            # would sum; hvdlite.torch follows Horovod too).
            # Dimension 0, or 1 for a scalar (sent as one row); decided at run time for a tensor of unknown rank.
            rows = [tf.concat([tf.shape(x, out_type=tf.int64), tf.ones([1], tf.int64)], 0)[:1] for x in xs]
            dys = [tf.zeros_like(o) if dy is None else tf.convert_to_tensor(dy) for o, dy in zip(outs, dys)]
            back = [
                bridge.Collective(OP_ALLGATHER, None if n is None else f"{n}.grad.rows", process_set_id=ps_id)
                for n in names
            ] + [
                bridge.Collective(
                    OP_ALLREDUCE,
                    None if n is None else f"{n}.grad",
                    ops.core_reduce_op(Average),
                    process_set_id=ps_id,
                )
                for n in names
            ]
            results = bridge.call(
                back,
                rows + dys,
                [tf.int64] * len(xs) + [d.dtype for d in dys],
                [tf.TensorShape([None])] * len(xs) + [d.shape for d in dys],
                "gradient of allgather",
            )
            me = bridge.process_set_rank(process_set)
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
    bridge.check_dtype(tensor, name)
    return _grouped_allgather_raw([tensor], [name], process_set)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    tensors = _to_tensors(tensors)
    names = [
        _op_name("HorovodGroupedAllgather", t, n, ignore_name_scope)
        for t, n in zip(tensors, _group_names(name, len(tensors)))
    ]
    for t, n in zip(tensors, names):
        bridge.check_dtype(t, n)
    return _grouped_allgather_raw(tensors, names, process_set) if tensors else []


# --------------------------------------------------------------------------- broadcast


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns root_rank's tensor on every rank of process_set (root_rank is a global rank). Differentiable, with
    Horovod's gradient: every rank's gradient averaged, on the root; zero elsewhere."""
    tensor = tf.convert_to_tensor(tensor)
    name = _op_name("HorovodBroadcast", tensor, name, ignore_name_scope)
    bridge.check_dtype(tensor, name)
    ps_id = bridge.process_set_id(process_set)
    root_rank = int(root_rank)

    @tf.custom_gradient
    def forward(x):
        out = bridge.call(
            [bridge.Collective(OP_BROADCAST, name, root_rank=root_rank, process_set_id=ps_id)],
            [x],
            [x.dtype],
            [x.shape],
            "broadcast",
        )[0]

        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            averaged = bridge.call(
                [
                    bridge.Collective(
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
    bridge.check_dtype(tensor, name)
    ps_id = bridge.process_set_id(process_set)
    shape = _gathered_shape(tensor)

    def run(x, s, op_name, what):
        inputs = [x] if s is None else [x, tf.cast(s, tf.int32)]
        return bridge.call(
            [bridge.Collective(OP_ALLTOALL, op_name, process_set_id=ps_id, with_splits=s is not None)],
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
    ps_id = bridge.process_set_id(process_set)
    reduce_op = ops.core_reduce_op(op)

    @tf.custom_gradient
    def forward(*xs):
        collectives = [
            bridge.Collective(OP_REDUCESCATTER, n, reduce_op, prescale, postscale, process_set_id=ps_id)
            for n in names
        ]
        shapes = [tf.TensorShape([None]).concatenate(x.shape[1:]) for x in xs]
        outs = bridge.call(collectives, xs, [x.dtype for x in xs], shapes, "reducescatter")

        def grad(*dys):
            if op not in (Average, Sum):
                raise NotImplementedError(f"hvdlite: the gradient of reducescatter with op={op} is not defined")
            dys = [tf.convert_to_tensor(dy) for dy in dys]
            back = [
                bridge.Collective(OP_ALLGATHER, None if n is None else f"{n}.grad", process_set_id=ps_id)
                for n in names
            ]
            gathered = bridge.call(
                back, dys, [d.dtype for d in dys], [x.shape for x in xs], "gradient of reducescatter"
            )
            # Horovod's rule: the gathered gradient times the set size for Sum (1 for Average), times the factors.
            scale = (bridge.process_set_size(process_set) if op == Sum else 1.0) * prescale * postscale
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
    bridge.check_dtype(wire, name)
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
        bridge.check_dtype(w, n)
    results = _grouped_reducescatter_raw(wires, names, op, prescale_factor, postscale_factor, process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed)]


# --------------------------------------------------------------------------- synchronisation


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called barrier (an op inside a tf.function)."""
    bridge.call(
        [bridge.Collective(OP_BARRIER, process_set_id=bridge.process_set_id(process_set))], [], [], [], "barrier"
    )


def join(device="") -> tf.Tensor:
    """Declares that this rank has no more data. Until every rank has joined, this rank takes part in other
    ranks' allreduces with zeros (allgathers with no rows). Returns the last rank to join (int32 tensor)."""
    return bridge.call([bridge.Collective(OP_JOIN)], [], [tf.int32], [tf.TensorShape([])], "join")[0]


# --------------------------------------------------------------------------- numpy-level (object collectives)
