"""Grouped allreduces of host tensors as one packed operation.

A grouped allreduce of many small CPU tensors would cost the core one operation per member: a request, a vote
and a fusion slot each. Instead the members are copied into one flat buffer, reduced as one operation and copied
back, as DistributedOptimizer's gradient buckets are (the copies are the core's, at memcpy speed).

Packing loses what the core checks per member: ranks whose members differ in shape but agree in total size would
reduce unrelated elements silently. So the packed operation carries a digest of its members' shapes
(hvdlite_request.layout), which the core compares across ranks as it compares shapes. Members of several dtypes
cannot share one buffer: such a group sends an empty operation whose digest says so. Whenever ranks disagree,
every rank gets the core's mismatch error and repeats the group member by member (the caller's fallback), whose
errors name the member, the ranks and what differs, as an unpacked group's do.

Every rank must take this route for a group for the packed operation to meet its peers: it is taken for every
group of two or more members that all live in host memory, unless the op is Adasum (whose result is not
elementwise).
"""

from typing import Callable, Dict, List, Optional

import torch

from hvdlite.common import ops
from hvdlite.common.errors import InvalidArgumentError, MismatchError
from hvdlite.torch.flat_layout import FlatLayout


class PackedGroup:
    """One group's flat buffer and request, for one layout of its members: their dtype and shapes."""

    def __init__(self, tensors: List[torch.Tensor], name: Optional[str], request_for: Callable):
        dtype = tensors[0].dtype
        self.packable = all(t.dtype is dtype for t in tensors)
        self.dtypes = [t.dtype for t in tensors]
        self.shapes = [t.shape for t in tensors]
        self.layout = FlatLayout(self.shapes if self.packable else [], dtype)
        self.name = None if name is None else f"{name}.packed"
        if not self.packable:  # a member the core cannot take must fail here, before any rank waits for the group
            for t in {t.dtype: t for t in tensors}.values():
                request_for(t, self.name)
        self.entry = ops.packed_request(request_for(self.layout.flat, self.name), self.digest())
        self.handle = None  # the last call's: until its synchronize() returns, another call needs a buffer of its own

    def digest(self) -> int:
        """The members' layout as the core compares it (with their dtypes where they cannot share a buffer)."""
        if self.packable:
            return self.layout.digest()
        return ops.layout_digest(self.shapes, [str(d) for d in self.dtypes])

    def fits(self, tensors: List[torch.Tensor]):
        """The members' addresses (ops.address_array()'s) if they match this layout and are contiguous host tensors;
        [] if they match but one is strided; None if they do not match."""
        pointers = []
        for t, dtype, shape in zip(tensors, self.dtypes, self.shapes):
            if not t.is_cpu or t.dtype is not dtype or t.shape != shape:
                return None
            if pointers is not None:
                if t.is_contiguous():
                    pointers.append(t.data_ptr())
                else:
                    pointers = None
        return [] if pointers is None else ops.address_array(pointers)


# Named groups' packed operations, under (name, member count, op, scale factors, process set id).
_groups: Dict[tuple, PackedGroup] = {}
_GROUP_LIMIT = 1024


def queue(
    tensors, name, key, request_for: Callable, fallback: Callable, handles: ops.HandleTable, in_place: bool = True
) -> Optional[int]:
    """Queues the grouped allreduce of tensors as one packed operation and returns its handle; None when the group
    takes the member-by-member route (fallback(tensors) queues it and returns a handle). request_for(flat, name):
    the request tuple of the packed buffer's in-place allreduce. in_place: the results land in tensors; otherwise
    in new tensors of their shapes, each with storage of its own."""
    if len(tensors) < 2:
        return None
    group = _groups.get(key) if name is not None else None
    pointers = None if group is None or handles.pending(group.handle) else group.fits(tensors)
    if pointers is None:
        if not all(t.is_cpu for t in tensors):
            return None
        try:
            group = PackedGroup(tensors, name, request_for)
        except InvalidArgumentError:  # an unsupported dtype, say: the member-by-member route names the member
            return None
        pointers = group.fits(tensors)
        if name is not None and (key not in _groups or not handles.pending(_groups[key].handle)):
            if len(_groups) >= _GROUP_LIMIT:
                _groups.clear()
            _groups[key] = group
    layout = group.layout
    if group.packable:
        layout.pack(tensors, pointers or None)
    flat_ptr = layout.flat.data_ptr()
    handle = ops.submit_prepared(group.entry, flat_ptr, flat_ptr)

    def finish():
        if not group.packable:  # every rank has these dtypes: the members go one by one
            return handles.synchronize(fallback(tensors))
        if not in_place:  # (empty_like: a third of torch.empty's cost with a shape and a dtype)
            if pointers:  # contiguous members make contiguous outputs
                outputs = [torch.empty_like(t) for t in tensors]
            else:
                outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
            layout.unpack(outputs, [o.data_ptr() for o in outputs])
            return outputs
        layout.unpack(tensors, pointers or None)
        return tensors

    def recover(error: MismatchError):
        # The ranks' members differ: every rank got this error and repeats the group member by member, whose
        # error names the member, the ranks and what differs.
        return handles.synchronize(fallback(tensors))

    group.handle = handles.add([handle], finish, keep_alive=(tensors, group), reads_handles=False, recover=recover)
    return group.handle
