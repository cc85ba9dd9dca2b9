"""Gradient averaging shared by DistributedGradientTape, the Keras DistributedOptimizer and the tf.compat.v1
DistributedOptimizer.

`GradientReducer.reduce` turns one list of gradients into one bridge call: dense gradients are cast by the
compressor, flattened and concatenated per (group, wire dtype) into one buffer each, reduced by the core, then
split and reshaped back; IndexedSlices are allgathered (values and indices, in the same call) or densified with
sparse_as_dense. A model with float32 weights costs one allreduce per step whatever its number of variables.
The buffer names depend only on the prefix, the group and the dtype, so they repeat every step (the core's
response cache applies) and agree on every rank.
"""

import warnings
from typing import List, Optional, Sequence

import tensorflow as tf

from hvdlite.common import ops
from hvdlite.common.basics import OP_ALLGATHER, OP_ALLREDUCE, global_process_set
from hvdlite.common.ops import Average, Sum
from hvdlite.tensorflow import bridge, mpi_ops
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.error_feedback import ErrorFeedbackSpec


def _var_key(variable):
    """Identity of a variable within this process (never sent to the core)."""
    return id(variable)


def check_gradient_op(op, gradient_predivide_factor: float) -> None:
    """horovod.tensorflow's checks (DistributedGradientTape, DistributedOptimizer), before any wrapping."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    ops.core_reduce_op(op)  # unknown op -> ValueError


def resolve_groups(num_groups: int, groups):
    """Horovod's `groups` argument: None, a positive number of groups, or a list of lists of variables.
    `num_groups` is its deprecated alias (used when groups is None)."""
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`", DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
    return groups


class GradientReducer:
    """Reduces lists of gradients over a process set with Horovod's DistributedOptimizer semantics.

    op: Average, Sum, Min, Max or Product for dense gradients; IndexedSlices (unless sparse_as_dense) support
    Average and Sum only, as in Horovod. gradient_predivide_factor f (op=Average): the gradients are scaled by
    1/f before the sum and by f/size after it; with any other op it has no effect (Horovod's Keras optimizer
    accepts it with op=Sum; horovod.tensorflow's entry points reject it, see check_gradient_op).
    groups (see resolve_groups): which gradients share a fused buffer. None: one buffer per dtype. n: the
    non-None reduced gradients split, in order, into n nearly equal runs (Horovod's split_list). A list of
    variable lists: one buffer per inner list, and one per variable that is in no list.
    """

    def __init__(
        self,
        prefix: str,
        compression=Compression.none,
        op=Average,
        sparse_as_dense: bool = False,
        gradient_predivide_factor: float = 1.0,
        process_set=global_process_set,
        groups=None,
        scale_local_gradients: bool = True,
    ):
        ops.core_reduce_op(op)
        if isinstance(compression, ErrorFeedbackSpec):
            raise ValueError(
                f"{compression!r} needs several exchanges per step and state across steps: it works with "
                "hvdlite.tensorflow.keras.DistributedOptimizer (or hvdlite.torch's), not with this entry point"
            )
        self.prefix = prefix
        self.compression = compression or Compression.none
        self.op = op
        self.sparse_as_dense = sparse_as_dense
        self.prescale, self.postscale = 1.0, 1.0
        if op == Average and gradient_predivide_factor != 1.0:
            self.prescale, self.postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
        self.process_set = process_set
        self.num_groups = groups if isinstance(groups, int) else 0
        self.group_of_var = {}
        for index, members in enumerate(groups if isinstance(groups, list) else ()):
            for v in members:
                if _var_key(v) in self.group_of_var:
                    raise ValueError("a variable appears in more than one group")
                self.group_of_var[_var_key(v)] = f"g{index}"
        self.scale_local_gradients = scale_local_gradients
        self.local_vars = set()

    def register_local_var(self, variable) -> None:
        """This variable's gradient stays local (not reduced); scaled by 1/size if scale_local_gradients."""
        self.local_vars.add(_var_key(variable))

    def _groups(self, dense) -> List[str]:
        """The buffer (group) of each dense gradient to reduce, given as [(position, variable)] in order."""
        if self.group_of_var:
            return [self.group_of_var.get(_var_key(v), f"v{i}") if v is not None else f"v{i}" for i, v in dense]
        if self.num_groups:
            per, extra = divmod(len(dense), self.num_groups)  # the first `extra` runs get one more (split_list)
            labels = []
            for k in range(self.num_groups):
                labels += [str(k)] * (per + (1 if k < extra else 0))
            return labels
        return ["0"] * len(dense)

    def reduce(self, grads: Sequence, variables: Optional[Sequence] = None) -> List:
        """Returns the reduced gradients, None where the gradient is None."""
        bridge.check_not_xla("the gradient allreduce (DistributedGradientTape / DistributedOptimizer)")
        grads = list(grads)
        variables = list(variables) if variables is not None else [None] * len(grads)
        results = list(grads)
        size = bridge.process_set_size(self.process_set)
        dense, sparse = [], []  # dense: (position, variable, wire tensor, ctx)
        for i, (g, v) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            if v is not None and _var_key(v) in self.local_vars:
                if self.scale_local_gradients and size > 1:
                    results[i] = (
                        tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                        if isinstance(g, tf.IndexedSlices)
                        else g / size
                    )
                continue
            if isinstance(g, tf.IndexedSlices) and not self.sparse_as_dense:
                if self.op not in (Average, Sum):
                    raise NotImplementedError(
                        "Only Sum and Average ops are supported with tf.IndexedSlices "
                        "(pass sparse_as_dense=True to reduce them densely)"
                    )
                sparse.append(i)
                continue
            wire, ctx = self.compression.compress(tf.convert_to_tensor(g))
            bridge.check_dtype(wire, f"gradient {i}")
            dense.append((i, v, wire, ctx))
        if not dense and not sparse:
            return results

        buckets = {}  # (group, wire dtype) -> [(position, wire tensor, ctx)], in position order on every rank
        for group, (i, _, wire, ctx) in zip(self._groups([(i, v) for i, v, _, _ in dense]), dense):
            buckets.setdefault((group, wire.dtype), []).append((i, wire, ctx))
        ps_id = bridge.process_set_id(self.process_set)
        reduce_op = ops.core_reduce_op(self.op)
        collectives, inputs, dtypes, shapes = [], [], [], []
        for (group, dtype), members in buckets.items():
            layout = 0  # ranks must agree on how the buffer is laid out, not only on its size, where shapes are known
            if len(members) == 1:
                buffer = members[0][1]
            else:
                buffer = tf.concat([tf.reshape(w, [-1]) for _, w, _ in members], axis=0)
                if all(w.shape.is_fully_defined() for _, w, _ in members):
                    layout = ops.layout_digest([w.shape.as_list() for _, w, _ in members])
            hint = (
                f" (hvdlite fuses the {dtype.name} gradients of {len(members)} variable(s) into this buffer: "
                "every rank must compute gradients, not None, for the same variables with the same shapes; "
                "tape.gradient(..., unconnected_gradients=tf.UnconnectedGradients.ZERO) makes unused "
                "variables contribute zeros)"
            )
            collectives.append(
                bridge.Collective(
                    OP_ALLREDUCE,
                    f"{self.prefix}.{group}.{dtype.name}",
                    reduce_op,
                    self.prescale,
                    self.postscale,
                    process_set_id=ps_id,
                    hint=hint,
                    in_place=len(members) > 1,
                    layout=layout,
                )
            )
            inputs.append(buffer)
            dtypes.append(dtype)
            shapes.append(buffer.shape)
        for i in sparse:
            g = grads[i]
            for part, tensor in (("values", g.values), ("indices", g.indices)):
                collectives.append(
                    bridge.Collective(OP_ALLGATHER, f"{self.prefix}.sparse.{i}.{part}", process_set_id=ps_id)
                )
                inputs.append(tensor)
                dtypes.append(tensor.dtype)
                shapes.append(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
        outputs = bridge.call(collectives, inputs, dtypes, shapes, "the gradient allreduce")

        for reduced, members in zip(outputs, buckets.values()):
            if len(members) == 1:
                pieces = [reduced]
            else:
                sizes = [w.shape.num_elements() for _, w, _ in members]
                if any(s is None for s in sizes):
                    sizes = tf.stack([tf.size(w) for _, w, _ in members])
                pieces = tf.split(reduced, sizes)
            for (i, wire, ctx), piece in zip(members, pieces):
                if len(members) > 1:
                    piece = tf.reshape(piece, wire.shape if wire.shape.is_fully_defined() else tf.shape(wire))
                results[i] = self.compression.decompress(piece, ctx)
        gathered = outputs[len(buckets) :]
        scale = mpi_ops._allreduce_scale(self.op, self.prescale, self.postscale, self.process_set)
        for n, i in enumerate(sparse):
            values, indices = gathered[2 * n], gathered[2 * n + 1]
            if scale != 1.0:
                values = values * tf.cast(scale, values.dtype)
            results[i] = tf.IndexedSlices(values, indices, dense_shape=grads[i].dense_shape)
        return results


# --------------------------------------------------------------------------- DistributedGradientTape


class _DistributedGradientTape:
    """Mixin placed in front of the tape's class (see DistributedGradientTape)."""

    def gradient(
        self,
        target,
        sources,
        output_gradients=None,
        use_generic_names=False,
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    ):
        """tf.GradientTape.gradient, then the reduction over the ranks. Horovod's use_generic_names (naming the
        collectives independently of the variables' names and name scopes) is what hvdlite always does: buffer
        names depend only on the group and dtype. tf.GradientTape's unconnected_gradients is accepted too, also
        in use_generic_names' position."""
        if isinstance(use_generic_names, tf.UnconnectedGradients):  # tape.gradient(t, s, None, ZERO), TF style
            unconnected_gradients = use_generic_names
        grads = super().gradient(
            target, sources, output_gradients=output_gradients, unconnected_gradients=unconnected_gradients
        )
        flat_grads = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        reduced = self._hvd_reducer.reduce(flat_grads, flat_sources if len(flat_sources) == len(flat_grads) else None)
        return tf.nest.pack_sequence_as(grads, reduced)

    def register_local_source(self, source) -> None:
        """source's gradient is not reduced (a rank-local variable); scaled by 1/size if scale_local_gradients."""
        self._hvd_reducer.register_local_var(source)


_tape_classes = {}


def DistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Returns gradtape, whose gradient() now averages the gradients over the ranks of process_set (Horovod's
    signature). The tape object is kept; its class becomes a subclass of tf.GradientTape's with the
    distributed gradient(). Use it around or after the `with` block:

        with tf.GradientTape() as tape:
            loss = ...
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
    """
    if isinstance(gradtape, _DistributedGradientTape):
        raise ValueError("gradtape is already a DistributedGradientTape")
    check_gradient_op(op, gradient_predivide_factor)
    groups = resolve_groups(num_groups, groups)
    base = type(gradtape)
    cls = _tape_classes.get(base)
    if cls is None:
        cls = _tape_classes[base] = type(
            base.__name__, (_DistributedGradientTape, base), {"__module__": base.__module__}
        )
    gradtape.__class__ = cls
    gradtape._hvd_reducer = GradientReducer(
        "DistributedGradientTape",
        compression,
        op,
        sparse_as_dense,
        gradient_predivide_factor,
        process_set,
        groups,
        scale_local_gradients,
    )
    return gradtape


def PartialDistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients=True,
):
    """DistributedGradientTape whose local_layers' (a layer or a list of layers) trainable weights keep their
    local gradients."""
    layers = local_layers_list(local_layers)
    tape = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
    )
    for layer in layers:
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape


def local_layers_list(local_layers) -> list:
    """Horovod's local_layers: None, a Keras layer, or a list of layers (checked before anything is wrapped)."""
    if local_layers is None:
        return []
    layers = list(local_layers) if isinstance(local_layers, (list, tuple)) else [local_layers]
    for layer in layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError(f"All local layers must be of tf.keras.layers.Layer type; got {type(layer).__name__}")
    return layers
