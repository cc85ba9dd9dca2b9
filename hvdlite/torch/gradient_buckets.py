"""Gradient buckets: how a DistributedOptimizer hands a step's gradients to the core in a few operations.

Gradients smaller than the core's FUSION_TENSOR_LIMIT are copied into flat buffers, one dtype each and up to
FUSION_THRESHOLD bytes, filled in reverse parameter order (the order backward usually produces them), as DDP's
buckets are; each buffer is one named allreduce. Larger gradients are reduced where they lie, as the core would
leave them unfused anyway. Every operation is prepared once (ops.PreparedBatch): a step queues them with their
buffer addresses only and waits for all of them in one call. So a step of thousands of small parameters costs the
core a handful of operations, and Python a few list operations and two C++ loops of copies per parameter, where
one collective per parameter cost several microseconds each. The copies into and out of the buckets are the
core's (hvdlite_gather_bytes and hvdlite_scatter_bytes), since torch's copies of many small CPU tensors pay a
dispatch each.

A bucket is queued as soon as all its gradients are final (during backward, when the optimizer reduces there) or
all at once from synchronize(). Results are copied back into the gradients by wait().
"""

from typing import Callable, Dict, List, Sequence

import torch

from hvdlite.common import basics, ops
from hvdlite.common.errors import HvdliteError, MismatchError
from hvdlite.torch.flat_layout import FlatLayout

_fast = ops.fast_calls


def _core_setting(name: str, default: int) -> int:
    for item in basics.build_info().split(";"):
        key, _, value = item.partition("=")
        if key == name:
            try:
                return int(value)
            except ValueError:
                break
    return default


class _Bucket:
    def __init__(self, members: List[torch.Tensor], dtype: torch.dtype):
        self.members = members  # parameters, in the order their gradients are laid out
        self.layout = FlatLayout([p.shape for p in members], dtype)
        self.flat, self.shapes = self.layout.flat, self.layout.shapes
        self.dtypes = [p.dtype for p in members]
        # Where hvdlite._fast_calls was built, a step's gradients are read and checked in one C call, which writes
        # their addresses here (the Python reads below remain the reference, and take every other case).
        self._fast_addresses = ops.ffi.new("uintptr_t[]", len(members)) if _fast else None
        self._fast_addresses_at = int(ops.ffi.cast("uintptr_t", self._fast_addresses)) if _fast else 0
        self.reset()

    def reset(self) -> None:
        self.grads = None  # this step's gradients, once copied into the bucket
        self.pointers = None  # their addresses, where they are contiguous
        self.refused: List[torch.Tensor] = []  # members that ready() refused: their owner reduces them alone

    @property
    def queued(self) -> bool:
        return self.grads is not None

    def fits(self, position: int, grad) -> bool:
        # A parameter replaced since the layout was made (p.data = ...) or a sparse gradient does not fit.
        return (
            grad is not None
            and not grad.is_sparse
            and grad.dtype is self.dtypes[position]
            and grad.shape == self.shapes[position]
        )

    def pack_as_laid_out(self) -> bool:
        """The common step in one C call: every member's gradient is there, contiguous and of its layout's shape and
        dtype, and is copied into the flat buffer. False (nothing copied) for the Python path to decide."""
        if not _fast:
            return False
        grads = _fast.bucket_gradients(self.members, self.shapes, self.flat.dtype, self._fast_addresses_at)
        if grads is None:
            return False
        ops.gather_bytes(self.flat.data_ptr(), self._fast_addresses, self.layout.nbytes)
        self.grads, self.pointers = grads, self._fast_addresses
        return True

    def gradients(self):
        """Every member's gradient (zeros where a rank has none this step), or None when one does not fit."""
        grads = [p.grad for p in self.members]
        try:
            fit = self._all_fit(grads)
        except AttributeError:  # no gradient on this rank this step: contribute zeros so others do not wait
            for i, g in enumerate(grads):
                if g is None:
                    p = self.members[i]
                    grads[i] = p.grad = torch.zeros_like(p)
            fit = self._all_fit(grads)
        return grads if fit else None

    def _all_fit(self, grads) -> bool:
        # Shape by shape, none kept: a list of thousands of shapes would live through the collector's young passes
        # and move on to the old generation, bringing on full collections of the whole heap every few steps.
        return all(g.shape == s and g.dtype is d for g, s, d in zip(grads, self.shapes, self.dtypes))

    def pack(self, grads: List[torch.Tensor]) -> bool:
        """Copies this step's gradients into the flat buffer; False (and nothing copied) if one is sparse."""
        pointers = FlatLayout.addresses(grads)  # (None for a sparse tensor, which is not contiguous)
        if pointers is None and any(g.is_sparse for g in grads):
            return False
        self.layout.pack(grads, pointers)  # (strided gradients, channels_last say, are copied by torch)
        self.grads, self.pointers = grads, pointers
        return True

    def unpack(self) -> None:
        """Copies the reduced flat buffer back into the gradients it was packed from (which hold their memory until
        reset())."""
        self.layout.unpack(self.grads, self.pointers)


class GradientBuckets:
    """The layout of every gradient of a list of parameters, and one step's exchange of them.

    request_for(tensor, name) gives ops.request()'s tuple for an in-place allreduce of tensor under name. A
    gradient that does not fit the layout (its parameter was replaced with another shape or dtype, it became
    sparse) is handed back to the caller to reduce on its own, and the layout is marked stale for the caller to
    build anew after the step (leaving out the parameters in .sparse)."""

    def __init__(
        self, params: Sequence[torch.Tensor], names: Dict[int, str], request_for: Callable[[torch.Tensor, str], tuple]
    ):
        limit = _core_setting("FUSION_TENSOR_LIMIT", 256 << 10)
        capacity = max(limit, _core_setting("FUSION_THRESHOLD", 64 << 20))
        self.buckets: List[_Bucket] = []
        self.large: List[torch.Tensor] = []
        open_members: Dict[torch.dtype, List[torch.Tensor]] = {}
        open_bytes: Dict[torch.dtype, int] = {}
        for p in reversed(list(params)):
            nbytes = p.numel() * p.element_size()
            if nbytes >= limit:
                self.large.append(p)
                continue
            if open_bytes.get(p.dtype, 0) + nbytes > capacity:
                self.buckets.append(_Bucket(open_members.pop(p.dtype), p.dtype))
                open_bytes[p.dtype] = 0
            open_members.setdefault(p.dtype, []).append(p)
            open_bytes[p.dtype] = open_bytes.get(p.dtype, 0) + nbytes
        for dtype, members in open_members.items():
            self.buckets.append(_Bucket(members, dtype))
        # id(p) -> (bucket index, position in it) for a small parameter; its batch index for a large one.
        self._slot: Dict[int, tuple] = {
            id(p): (i, position) for i, b in enumerate(self.buckets) for position, p in enumerate(b.members)
        }
        # By bucket, its gradients not yet final this step; and id(p) -> p's bucket. Both are read by the
        # optimizer's hook in C as well (hvdlite/common/gradient_calls.c), which counts a gradient off here.
        self.waiting: List[int] = [len(b.members) for b in self.buckets]
        self.bucket_of: Dict[int, int] = {key: i for key, (i, _) in self._slot.items()}
        self._large_index: Dict[int, int] = {id(p): len(self.buckets) + i for i, p in enumerate(self.large)}
        self._large_layout: Dict[int, tuple] = {id(p): (p.shape, p.dtype) for p in self.large}
        self._large_param: Dict[int, torch.Tensor] = {id(p): p for p in self.large}
        bucket_names = [
            f"{names[id(b.members[0])]}.bucket{i}.{b.flat.dtype}.{len(b.members)}" for i, b in enumerate(self.buckets)
        ]
        for name, bucket in zip(bucket_names, self.buckets):  # the timeline shows each gradient on its own row
            ops.describe_members(name, [names[id(p)] for p in bucket.members])
        requests = [request_for(b.flat, name) for name, b in zip(bucket_names, self.buckets)]
        requests += [request_for(p.detach(), names[id(p)]) for p in self.large]
        # Ranks must agree on how each bucket is laid out, not only on its size.
        layouts = [b.layout.digest() for b in self.buckets]
        self._batch = ops.PreparedBatch(requests, layouts)
        self._bucket_names, self._names, self._request_for = bucket_names, names, request_for
        self._large_queued: Dict[int, bool] = {}
        self.parameter_count = len(self._slot) + len(self.large)  # parameters laid out
        self.stale = False
        self.sparse = set()  # ids of parameters whose gradients came sparse: the next layout leaves them out

    def covers(self, p: torch.Tensor) -> bool:
        return id(p) in self._slot or id(p) in self._large_index

    def ready(self, p: torch.Tensor) -> bool:
        """p's gradient is final for this step: queues it (a large one) or its bucket once every member is ready.
        False when the gradient does not fit: the caller reduces it on its own."""
        key = id(p)
        grad = p.grad
        index = self._large_index.get(key)
        if index is not None:
            if not self._fits_large(key, grad):
                return False
            self._batch.submit_one(index, grad.data_ptr())
            self._large_queued[key] = True
            return True
        i, position = self._slot[key]
        bucket = self.buckets[i]
        if not bucket.fits(position, grad):
            bucket.refused.append(p)
            self._note_misfit(p, grad)
            return False
        self.waiting[i] -= 1
        if self.waiting[i] == 0 and not bucket.refused:
            if not bucket.pack_as_laid_out():
                bucket.pack([m.grad for m in bucket.members])  # (fits() let no sparse gradient in)
            self._batch.submit_one(i, bucket.flat.data_ptr())
        return True

    def bucket_full(self, i: int) -> List[torch.Tensor]:
        """Every member of bucket i has its final gradient, counted off by the optimizer's hook in C, which checks
        none of them: packs and queues the bucket, or returns the members whose gradients do not fit its layout
        (marked as ready() marks them), for the caller to reduce alone; submit_rest() then hands back the others."""
        bucket = self.buckets[i]
        # The one C read first: only a bucket it does not take is checked member by member, as ready() would have.
        if not bucket.pack_as_laid_out():
            misfits = [p for position, p in enumerate(bucket.members) if not bucket.fits(position, p.grad)]
            for p in misfits:
                bucket.refused.append(p)
                self._note_misfit(p, p.grad)
            if misfits:
                return misfits
            bucket.pack([m.grad for m in bucket.members])  # (fits() let no sparse gradient in)
        self._batch.submit_one(i, bucket.flat.data_ptr())
        return []

    def _note_misfit(self, p: torch.Tensor, grad) -> None:
        self.stale = True
        if grad is not None and grad.is_sparse:
            self.sparse.add(id(p))

    def _fits_large(self, key: int, grad) -> bool:
        shape, dtype = self._large_layout[key]
        if grad is None or grad.is_sparse or grad.shape != shape or grad.dtype is not dtype:
            self._note_misfit(self._large_param[key], grad)
            return False
        return grad.is_contiguous()  # a strided gradient goes on its own, as a contiguous copy

    def submit_rest(self) -> List[torch.Tensor]:
        """Queues every bucket and large gradient not queued yet this step, in one call (zeros for a parameter
        without a gradient). Returns the parameters whose gradients the caller must reduce on its own."""
        indices, pointers, alone = [], [], []
        for i, bucket in enumerate(self.buckets):
            if bucket.queued:
                continue
            if not bucket.refused and bucket.pack_as_laid_out():
                indices.append(i)
                pointers.append(bucket.flat.data_ptr())
                continue
            grads = None if bucket.refused else bucket.gradients()
            if grads is None or not bucket.pack(grads):
                self.stale = True
                for p in bucket.members:
                    if p.grad is not None and p.grad.is_sparse:
                        self.sparse.add(id(p))
                alone += [p for p in bucket.members if all(p is not r for r in bucket.refused)]
                continue
            indices.append(i)
            pointers.append(bucket.flat.data_ptr())
        for p in self.large:
            if id(p) in self._large_queued:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad = p.grad
            if not self._fits_large(id(p), grad):
                alone.append(p)
                continue
            indices.append(self._large_index[id(p)])
            pointers.append(grad.data_ptr())
        self._batch.submit_many(indices, pointers)
        return alone

    def wait(self) -> None:
        """Waits for everything queued this step, copies the buckets' results into the gradients and gets ready for
        the next step; raises the first error once all have finished."""
        try:
            self._batch.wait_all()
            for bucket in self.buckets:
                if bucket.queued:
                    bucket.unpack()
        except MismatchError as e:
            self._raise_member_mismatch(e)
            raise
        finally:
            for i, bucket in enumerate(self.buckets):
                bucket.reset()
                self.waiting[i] = len(bucket.members)
            self._large_queued.clear()

    def _raise_member_mismatch(self, error: MismatchError) -> None:
        """After a bucket failed because its gradients are laid out differently on some rank (the ranks' models
        differ), every rank reduces that bucket's gradients one by one under their parameters' names, so that the
        error names the parameter, the ranks and the shapes. Returns if the bucket is not the one named."""
        message = str(error)
        for name, bucket in zip(self._bucket_names, self.buckets):
            if bucket.queued and f"'{name}'" in message:
                works = [g.contiguous() for g in bucket.grads]
                handles = ops.submit_many(
                    [self._request_for(w, self._names[id(p)]) for p, w in zip(bucket.members, works)]
                )
                first = None
                for handle in handles:  # wait for every one before raising: none is left using the gradients
                    try:
                        ops.wait_and_release(handle, works)
                    except HvdliteError as member_error:
                        first = first or member_error
                if first is not None:
                    raise first from error
                return
