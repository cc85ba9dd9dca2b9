"""API audit: every public name of horovod.torch exists in hvdlite.torch and accepts Horovod's parameters.

HOROVOD_TORCH_API is horovod.torch's public surface as of Horovod 0.28 (horovod/torch/__init__.py, which
re-exports horovod/torch/mpi_ops.py, functions.py, optimizer.py and sync_batch_norm.py), with each callable's
signature written out as Horovod declares it. For each entry the test checks that hvdlite.torch has the name,
that every Horovod parameter exists under the same name, in the same position when Horovod's can be passed
positionally, and with the same default (literal defaults by value; Compression.none, global_process_set and the
reduce-op constants by identity).

Names owned by work that has not landed yet are listed in PENDING; the test requires them to be exactly the
names still missing, so it fails when one lands (remove it from PENDING then) and when anything else is missing.
"""

import ast
import inspect
import types

import pytest

import hvdlite.torch as hvd

HOROVOD_TORCH_API = [
    # horovod.torch.mpi_ops: basics
    "init(comm=None, process_sets=None)",
    "shutdown()",
    "is_initialized()",
    "start_timeline(file_path, mark_cycles=False)",
    "stop_timeline()",
    "size()",
    "local_size()",
    "cross_size()",
    "rank()",
    "local_rank()",
    "cross_rank()",
    "mpi_threads_supported()",
    "mpi_enabled()",
    "mpi_built()",
    "gloo_enabled()",
    "gloo_built()",
    "nccl_built()",
    "ddl_built()",
    "ccl_built()",
    "cuda_built()",
    "rocm_built()",
    # process sets
    "ProcessSet(ranks_or_comm)",
    "add_process_set(process_set)",
    "remove_process_set(process_set)",
    # collectives
    "allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0, "
    "postscale_factor=1.0, process_set=global_process_set)",
    "allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, "
    "process_set=global_process_set)",
    "allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, "
    "process_set=global_process_set)",
    "allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, "
    "process_set=global_process_set)",
    "grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, "
    "prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set)",
    "grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, "
    "postscale_factor=1.0, process_set=global_process_set)",
    "grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, "
    "process_set=global_process_set)",
    "grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, "
    "postscale_factor=1.0, process_set=global_process_set)",
    "sparse_allreduce_async(tensor, name, op, process_set=global_process_set)",
    "allgather(tensor, name=None, process_set=global_process_set)",
    "allgather_async(tensor, name=None, process_set=global_process_set)",
    "grouped_allgather(tensors, name=None, process_set=global_process_set)",
    "grouped_allgather_async(tensors, name=None, process_set=global_process_set)",
    "broadcast(tensor, root_rank, name=None, process_set=global_process_set)",
    "broadcast_async(tensor, root_rank, name=None, process_set=global_process_set)",
    "broadcast_(tensor, root_rank, name=None, process_set=global_process_set)",
    "broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set)",
    "alltoall(tensor, splits=None, name=None, process_set=global_process_set)",
    "alltoall_async(tensor, splits=None, name=None, process_set=global_process_set)",
    "reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set, "
    "prescale_factor=1.0, postscale_factor=1.0)",
    "reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0, "
    "postscale_factor=1.0)",
    "grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average, "
    "process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0)",
    "grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set, "
    "prescale_factor=1.0, postscale_factor=1.0)",
    "join(device=-1)",
    "barrier(process_set=global_process_set)",
    "poll(handle)",
    "synchronize(handle)",
    # horovod.torch.functions
    "broadcast_parameters(params, root_rank, process_set=global_process_set)",
    "broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set)",
    "broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set)",
    "allgather_object(obj, name=None, process_set=global_process_set)",
    # horovod.torch.optimizer, horovod.torch.sync_batch_norm
    "DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, "
    "backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, "
    "sparse_as_dense=False, process_set=global_process_set)",
    "SyncBatchNorm(num_features, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)",
]

# Public names that are not callables with a signature to compare.
HOROVOD_TORCH_CONSTANTS = ["Average", "Sum", "Adasum", "Min", "Max", "Product"]
HOROVOD_TORCH_OBJECTS = ["global_process_set", "Compression", "HorovodInternalError", "elastic"]

# Owned by work not landed yet (none now). The test asserts these are exactly the missing names.
PENDING: set = set()


def _parse(spec: str):
    call = ast.parse(spec, mode="eval").body
    params = [(arg.id, inspect.Parameter.empty) for arg in call.args]
    params += [(kw.arg, kw.value) for kw in call.keywords]
    return call.func.id, params


def _default_matches(expected_node, actual) -> bool:
    try:
        return actual == ast.literal_eval(expected_node)
    except ValueError:  # a name such as Compression.none or global_process_set: the same object
        return actual is eval(compile(ast.Expression(expected_node), "<spec>", "eval"), vars(hvd))


def _all_names():
    return [_parse(spec)[0] for spec in HOROVOD_TORCH_API] + HOROVOD_TORCH_CONSTANTS + HOROVOD_TORCH_OBJECTS


def test_missing_names_are_exactly_the_pending_ones():
    missing = {name for name in _all_names() if not hasattr(hvd, name)}
    assert missing == PENDING, (
        f"missing from hvdlite.torch: {sorted(missing - PENDING)}; landed, so remove "
        f"from PENDING: {sorted(PENDING - missing)}"
    )


@pytest.mark.parametrize("spec", HOROVOD_TORCH_API, ids=[_parse(s)[0] for s in HOROVOD_TORCH_API])
def test_signature_accepts_horovods_parameters(spec):
    name, horovod_params = _parse(spec)
    if name in PENDING and not hasattr(hvd, name):
        return  # its absence is asserted by test_missing_names_are_exactly_the_pending_ones
    ours = inspect.signature(getattr(hvd, name)).parameters
    ours_list = list(ours.values())
    for position, (param, default) in enumerate(horovod_params):
        assert param in ours, f"hvdlite.torch.{name} has no parameter {param!r} (Horovod: {spec})"
        mine = ours[param]
        assert mine.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY), (
            f"hvdlite.torch.{name}: {param!r} cannot be passed positionally"
        )
        assert ours_list[position].name == param, (
            f"hvdlite.torch.{name}: position {position} is {ours_list[position].name!r}, Horovod has {param!r}"
        )
        if default is inspect.Parameter.empty:
            assert mine.default is inspect.Parameter.empty, f"hvdlite.torch.{name}: {param!r} should be required"
        else:
            assert _default_matches(default, mine.default), (
                f"hvdlite.torch.{name}: {param!r} defaults to {mine.default!r}, Horovod: {ast.unparse(default)}"
            )
    extra_required = [
        p.name
        for p in ours_list[len(horovod_params) :]
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    assert not extra_required, f"hvdlite.torch.{name} requires parameters Horovod does not have: {extra_required}"


def test_constants_and_objects():
    # Horovod's values, so code that compares or serialises them keeps working.
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert isinstance(hvd.global_process_set, hvd.ProcessSet) and hvd.global_process_set.process_set_id == 0
    assert hvd.Compression.none is not None and hvd.Compression.fp16 is not None
    assert issubclass(hvd.HorovodInternalError, Exception)
    assert isinstance(hvd.elastic, types.ModuleType)
    # horovod.torch.elastic's public names
    for name in ("run", "State", "TorchState", "ElasticSampler", "HostsUpdatedInterrupt"):
        assert hasattr(hvd.elastic, name), name
    assert inspect.signature(hvd.elastic.TorchState).parameters.keys() >= {"model", "optimizer", "kwargs"}
    assert list(inspect.signature(hvd.elastic.ElasticSampler).parameters) == ["dataset", "shuffle", "seed"]


def test_build_queries_are_truthful():
    # No CUDA/ROCm/oneCCL/DDL backend exists in hvdlite: scripts that branch on these must take the CPU path.
    for query in (hvd.cuda_built, hvd.rocm_built, hvd.ccl_built, hvd.ddl_built):
        assert query() is False, query.__name__
    assert hvd.gloo_built() is True and hvd.mpi_threads_supported() is True
