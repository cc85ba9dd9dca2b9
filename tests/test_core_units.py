"""Single-process tests: the pure-Python pieces (error mapping, reduce-op codes, dtype codes, handle table) and a
size-1 job run in-process (hvd.init() without a launcher), including property tests of the core's scaling
kernels (Horovod's integer truncation, float16/bfloat16 conversion) through allreduce's pre/postscale factors."""

from __future__ import annotations

import os
import re

import pytest
import torch
from hvdjob import ALL_DTYPES, check, horovod_scale, make, reduce_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hvdlite.torch as hvd
from hvdlite.common import errors, ops
from hvdlite.common.binding import check as binding_check
from hvdlite.torch import core_ops

pytestmark = pytest.mark.timeout(120)

HEADER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hvdlite_core", "include", "hvdlite.h"
)


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "status,cls",
    [
        (2, errors.InvalidArgumentError),
        (3, errors.NotInitializedError),
        (4, errors.MismatchError),
        (5, errors.PeerError),
        (6, errors.HvdliteTimeoutError),
        (7, errors.InternalError),
        (8, errors.AbortedError),
    ],
)
def test_error_for_status_maps_each_code(status, cls):
    e = errors.error_for_status(status, "the message")
    assert type(e) is cls
    assert str(e) == "the message"
    assert isinstance(e, errors.HvdliteError) and isinstance(e, errors.HorovodInternalError)
    assert isinstance(e, RuntimeError)


@pytest.mark.parametrize("status", [1, 9, 99, -1])
def test_error_for_unknown_status_is_the_base_class(status):
    e = errors.error_for_status(status, "x")
    assert type(e) is errors.HvdliteError


def test_error_codes_match_the_c_header():
    with open(HEADER) as f:
        text = f.read()
    codes = dict((name, int(value)) for name, value in re.findall(r"HVDLITE_(\w+) = (\d+)", text))
    assert type(errors.error_for_status(codes["INVALID_ARGUMENT"], "")) is errors.InvalidArgumentError
    assert type(errors.error_for_status(codes["PRECONDITION"], "")) is errors.NotInitializedError
    assert type(errors.error_for_status(codes["MISMATCH"], "")) is errors.MismatchError
    assert type(errors.error_for_status(codes["REMOTE_ERROR"], "")) is errors.PeerError
    assert type(errors.error_for_status(codes["TIMEOUT"], "")) is errors.HvdliteTimeoutError
    assert type(errors.error_for_status(codes["INTERNAL"], "")) is errors.InternalError
    assert type(errors.error_for_status(codes["ABORTED"], "")) is errors.AbortedError


def test_error_class_hierarchy_and_exports():
    assert errors.HorovodInternalError is errors.HvdliteError
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.NotInitializedError, ValueError)
    assert issubclass(errors.HvdliteTimeoutError, TimeoutError)
    for cls in (errors.MismatchError, errors.PeerError, errors.AbortedError, errors.InternalError):
        assert issubclass(cls, errors.HvdliteError)
        assert not issubclass(cls, ValueError)
    for name in (
        "HvdliteError",
        "HorovodInternalError",
        "MismatchError",
        "InvalidArgumentError",
        "NotInitializedError",
        "PeerError",
        "HvdliteTimeoutError",
        "AbortedError",
    ):
        assert getattr(hvd, name) is getattr(errors, name)
    import hvdlite

    assert hvdlite.HorovodInternalError is errors.HvdliteError


def test_binding_check():
    binding_check(0)  # no exception
    with pytest.raises(errors.InvalidArgumentError):
        binding_check(2)


# ------------------------------------------------------------------------------------------------ ops


def test_horovod_reduce_op_constants():
    # the same values as horovod.torch, so code comparing them keeps working
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)


def test_core_reduce_op_matches_the_c_header():
    with open(HEADER) as f:
        text = f.read()
    codes = dict(
        (name, int(value))
        for name, value in re.findall(r"HVDLITE_(SUM|AVERAGE|MIN|MAX|PRODUCT|ADASUM) = (\d+)", text)
    )
    assert ops.core_reduce_op(hvd.Sum) == codes["SUM"]
    assert ops.core_reduce_op(hvd.Average) == codes["AVERAGE"]
    assert ops.core_reduce_op(hvd.Min) == codes["MIN"]
    assert ops.core_reduce_op(hvd.Max) == codes["MAX"]
    assert ops.core_reduce_op(hvd.Product) == codes["PRODUCT"]
    assert ops.core_reduce_op(hvd.Adasum) == codes["ADASUM"]


def test_core_reduce_op_rejects_unknown_ops():
    for bad in (6, -1, "Sum", None, 1.5, [1], {}):
        with pytest.raises(ValueError, match="unknown reduce op"):
            ops.core_reduce_op(bad)


def test_dtype_codes_agree_everywhere():
    with open(HEADER) as f:
        text = f.read()
    header = {
        name.lower(): int(v)
        for name, v in re.findall(
            r"HVDLITE_(UINT8|INT8|UINT16|INT16|INT32|INT64|FLOAT16|BFLOAT16|FLOAT32|FLOAT64|BOOL) = (\d+)", text
        )
    }
    assert ops.DTYPE_CODES == header
    assert {str(d).replace("torch.", ""): c for d, c in core_ops._DTYPES.items()} == header
    assert set(core_ops._DTYPES) == set(ALL_DTYPES)


def test_handle_table_synchronize_unknown_handle():
    table = ops.HandleTable()
    with pytest.raises(ValueError, match="unknown or already synchronized"):
        table.synchronize(12345)
    h = table.add([], lambda: "result")
    assert table.poll(h)
    assert table.synchronize(h) == "result"
    with pytest.raises(ValueError):
        table.synchronize(h)


def test_handle_table_counts_a_handle_pending_until_its_synchronize_returns():
    """A packed group reuses its buffer only when its last call is not pending: that must hold while the
    synchronize() of that call still waits or copies the results out of the buffer, not only before it starts."""
    table = ops.HandleTable()
    seen = []
    h = table.add([], lambda: seen.append(table.pending(h)) or "result")
    assert table.pending(h)
    assert table.synchronize(h) == "result"
    assert seen == [True] and not table.pending(h)
    failing = table.add([], lambda: seen.append(table.pending(failing)) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        table.synchronize(failing)
    assert seen == [True, True] and not table.pending(failing)


shapes_strategy = st.lists(st.lists(st.integers(0, 6), max_size=3).map(tuple), min_size=1, max_size=5)


@given(shapes_strategy, shapes_strategy)
def test_layout_digests_differ_where_layouts_do(a, b):
    """The digest packed tensors carry is non-zero, equal for equal layouts (also across torch.Size and lists),
    and differs for different ones, whether or not their sizes agree: [2, 3] against [3, 2], a dimension of 1
    more or less, the members' order, their dtypes."""
    digest = ops.layout_digest
    assert digest(a) != 0 and digest(a) == digest([torch.Size(s) for s in a]) == digest([list(s) for s in a])
    assert (digest(a) == digest(b)) == (a == b)
    assert digest(a, ["float32"] * len(a)) != digest(a)
    assert digest([(2, 3)]) != digest([(3, 2)]) and digest([(6,)]) != digest([(6, 1)])
    if len(a) > 1 and a[0] != a[1]:
        assert digest(a) != digest([a[1], a[0], *a[2:]])


# ------------------------------------------------------------------------------------------------ size-1 job


@pytest.fixture(scope="module")
def solo():
    """hvd.init() in this process: no launcher variables, so a job of one rank."""
    for key in list(os.environ):
        assert not key.startswith("HVDLITE_RANK"), "run without launcher variables"
    assert not hvd.is_initialized()
    with pytest.raises(hvd.NotInitializedError):
        hvd.rank()
    hvd.init()
    yield hvd
    hvd.shutdown()
    assert not hvd.is_initialized()


def test_solo_layout(solo):
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == (
        0,
        1,
        0,
        1,
        0,
        1,
    )
    assert hvd.is_homogeneous()
    hvd.init()  # idempotent
    assert hvd.size() == 1
    assert "version=" in hvd.build_info()


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_solo_every_collective(solo, dtype):
    ops_by_name = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
    for shape in ((0,), (1,), (17,), (7, 143), (1001, 300), ()):
        x = make(0, ("solo", dtype, shape), shape, dtype)
        for name, op in ops_by_name.items():
            if dtype == torch.bool and name == "Average":
                with pytest.raises(hvd.InvalidArgumentError):
                    hvd.allreduce(x, op=op)
                continue
            check(f"allreduce {name} {shape}", hvd.allreduce(x, op=op), x)
            y = x.clone()
            assert hvd.allreduce_(y, op=op) is y
            check(f"allreduce_ {name} {shape}", y, x)
            check(f"allreduce_async {name}", hvd.synchronize(hvd.allreduce_async(x, op=op, name=f"s.{name}")), x)
            if shape:
                check(f"reducescatter {name} {shape}", hvd.reducescatter(x, op=op), x)
        check(f"allgather {shape}", hvd.allgather(x), x.reshape(1) if x.dim() == 0 else x)
        check(f"broadcast {shape}", hvd.broadcast(x, 0), x)
        y = x.clone()
        assert hvd.broadcast_(y, 0) is y
        if shape:
            check(f"alltoall {shape}", hvd.alltoall(x), x)
            out, splits = hvd.synchronize(hvd.alltoall_async(x))
            check(f"alltoall_async {shape}", out, x)
            check("alltoall splits", splits, torch.tensor([shape[0]], dtype=torch.int32))
            out, splits = hvd.alltoall(x, splits=[shape[0]])
            check(f"alltoall with splits {shape}", out, x)
    hvd.barrier()


def test_solo_grouped_and_join(solo):
    xs = [torch.arange(5.0), torch.arange(3, dtype=torch.int32), torch.ones(2, 2, dtype=torch.float16)]
    for o, x in zip(hvd.grouped_allreduce(xs, op=hvd.Sum), xs):
        check("grouped_allreduce", o, x)
    for o, x in zip(hvd.grouped_allgather(xs), xs):
        check("grouped_allgather", o, x)
    for o, x in zip(hvd.grouped_reducescatter(xs, op=hvd.Sum), xs):
        check("grouped_reducescatter", o, x)
    ys = [x.clone() for x in xs]
    hvd.grouped_allreduce_(ys, op=hvd.Max)
    for y, x in zip(ys, xs):
        check("grouped_allreduce_", y, x)
    assert hvd.join() == 0
    check("after join", hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.ones(2))


def test_solo_argument_errors(solo):
    with pytest.raises(hvd.InvalidArgumentError, match="root rank 1"):
        hvd.broadcast(torch.ones(2), 1)
    with pytest.raises(hvd.InvalidArgumentError, match="2 entries"):
        hvd.alltoall(torch.ones(2), splits=[1, 1])
    with pytest.raises(hvd.InvalidArgumentError, match="already exists"):
        hvd.add_process_set([0])  # the global set has exactly these ranks
    with pytest.raises(hvd.InvalidArgumentError, match="distinct ranks"):
        hvd.add_process_set([1])
    with pytest.raises(hvd.HvdliteError, match="complex64"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(hvd.InvalidArgumentError, match="bool"):
        hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Sum, prescale_factor=2.0)
    with pytest.raises(hvd.HvdliteError, match="meta"):
        hvd.allgather(torch.empty(2, device="meta"))
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), process_set=hvd.ProcessSet([0]))  # never registered
    check("still fine", hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.ones(2))


def test_solo_allreduce_of_views_and_strided_tensors(solo):
    base = torch.arange(24.0).reshape(4, 6)
    view = base[:, 1::2]  # non-contiguous
    check("strided allreduce", hvd.allreduce(view, op=hvd.Sum), view.contiguous())
    hvd.allreduce_(view, op=hvd.Sum, postscale_factor=2.0)
    check("strided allreduce_ wrote through the view", base[:, 1::2], torch.arange(24.0).reshape(4, 6)[:, 1::2] * 2)
    check("other columns untouched", base[:, 0::2], torch.arange(24.0).reshape(4, 6)[:, 0::2])


# -------------------------------------------------------------------------- property tests of the scaling kernels

SCALE_SETTINGS = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
factors = st.sampled_from([0.5, 0.25, 1.5, 2.0, 3.0, -1.0, 0.1, 1 / 3, 7.0, 1e-3, 1e3])


@SCALE_SETTINGS
@given(
    values=st.lists(st.integers(-100_000, 100_000), min_size=1, max_size=50),
    pre=factors,
    post=factors,
    dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_integer_scaling_truncates_toward_zero(solo, values, pre, post, dtype):
    x = torch.tensor(values, dtype=dtype)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=pre, postscale_factor=post)
    check(f"int scaling pre={pre} post={post}", out, reduce_reference([x], "Sum", dtype, pre, post))


@SCALE_SETTINGS
@given(
    values=st.lists(st.integers(0, 255), min_size=1, max_size=50),
    pre=st.sampled_from([0.5, 1.5, -0.5, 2.5, 1 / 3]),
    dtype=st.sampled_from(
        [torch.uint8, torch.int8, torch.int16] + ([torch.uint16] if hasattr(torch, "uint16") else [])
    ),
)
def test_narrow_integer_scaling(solo, values, pre, dtype):
    """Products truncate toward zero and wrap to the type's width (uint8 * -0.5, int8 * 2.5), as in Horovod."""
    x = torch.tensor(values, dtype=torch.int64).to(dtype)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=pre)
    expected = torch.trunc(x.to(torch.float64) * pre).to(torch.int64).to(dtype)
    check(f"{dtype} scaling pre={pre}", out, expected)
    check(f"{dtype} scaling pre={pre} (helper)", out, horovod_scale(x, pre))


def test_integer_average_truncates_like_horovod(solo):
    """Horovod folds Average into the postscale (postscale / size) and truncates: 7 * (1/3) -> 2, -7 * 0.5 -> -3."""
    x = torch.tensor([7, -7, 5, -5], dtype=torch.int32)
    check(
        "postscale 1/3",
        hvd.allreduce(x, op=hvd.Sum, postscale_factor=1 / 3),
        torch.tensor([2, -2, 1, -1], dtype=torch.int32),
    )
    check(
        "prescale 0.5",
        hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5),
        torch.tensor([3, -3, 2, -2], dtype=torch.int32),
    )


def _finite_bits(dtype):
    def ok(bits):
        v = torch.tensor([bits], dtype=torch.int16).view(dtype)
        return bool(torch.isfinite(v.float()).all())

    return st.integers(-(1 << 15), (1 << 15) - 1).filter(ok)


@SCALE_SETTINGS
@given(bits=st.lists(_finite_bits(torch.float16), min_size=1, max_size=40), factor=factors)
def test_float16_scaling_matches_round_to_nearest_even(solo, bits, factor):
    """The core converts half->float, multiplies by float(factor) and rounds back: exactly what PyTorch does
    (subnormals, overflow to inf and ties included)."""
    x = torch.tensor(bits, dtype=torch.int16).view(torch.float16)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=factor)
    expected = (x.float() * torch.tensor(factor, dtype=torch.float32)).to(torch.float16)
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16)) or torch.equal(out, expected), (
        x,
        out,
        expected,
    )


@SCALE_SETTINGS
@given(bits=st.lists(_finite_bits(torch.bfloat16), min_size=1, max_size=40), factor=factors)
def test_bfloat16_scaling_matches_round_to_nearest_even(solo, bits, factor):
    x = torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16)
    out = hvd.allreduce(x, op=hvd.Sum, postscale_factor=factor)
    expected = (x.float() * torch.tensor(factor, dtype=torch.float32)).to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16)) or torch.equal(out, expected), (
        x,
        out,
        expected,
    )


@SCALE_SETTINGS
@given(values=st.lists(st.floats(-(2.0**100), 2.0**100, width=32), min_size=1, max_size=40), factor=factors)
def test_float32_scaling(solo, values, factor):
    x = torch.tensor(values, dtype=torch.float32)
    out = hvd.allreduce(x, op=hvd.Average, prescale_factor=factor)
    expected = x * torch.tensor(factor, dtype=torch.float32)
    assert torch.equal(out, expected), (x, out, expected)


def test_half_conversion_edge_values(solo):
    """float16 corner cases of the core's float->half rounding: largest finite, ties at the overflow boundary,
    smallest normal and subnormal, halfway below the smallest subnormal, ties to even, negative zero."""
    targets = [
        65504.0,
        65519.0,
        65520.0,
        6.1e-5,
        5.96e-8,
        2.98e-8,
        2.99e-8,
        1.0 + 2**-11,
        1.0 + 3 * 2**-11,
        -0.0,
        1e-10,
        -65520.0,
    ]
    # feed float16 inputs whose product with the factor lands on the target before rounding
    for target in targets:
        for factor in (2.0, 0.5, 3.0):
            x = torch.tensor([target / factor], dtype=torch.float32).to(torch.float16)
            out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=factor)
            expected = (x.float() * factor).to(torch.float16)
            assert torch.equal(out.view(torch.int16), expected.view(torch.int16)), (target, factor, out, expected)


def test_torch_distributed_optimizer_refuses_horovods_adasum_optimizer():
    """Horovod's DistributedOptimizer(op=Adasum) is a different algorithm (Adasum of parameter deltas after a local
    step); hvdlite says so instead of silently reducing gradients with Adasum. allreduce(op=Adasum) is tested in
    test_adasum.py."""
    import torch

    import hvdlite.torch as hvd_torch

    model = torch.nn.Linear(2, 2)
    with pytest.raises(NotImplementedError, match="delta-based Adasum optimizer"):
        hvd_torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            op=hvd_torch.Adasum,
        )


# ------------------------------------------------------------------------------------------------ binding


def test_a_compiled_binding_that_cannot_load_leaves_abi_mode_to_serve(tmp_path, monkeypatch):
    from hvdlite.common import binding

    assert binding.mode == "compiled"  # a source build's
    (tmp_path / "_hvdlite_binding.abi3.so").write_bytes(b"not a shared library")
    monkeypatch.setattr(binding, "_PACKAGE_DIR", str(tmp_path))
    assert binding._compiled_binding() is None
    (tmp_path / "_hvdlite_binding.abi3.so").unlink()
    assert binding._compiled_binding() is None
