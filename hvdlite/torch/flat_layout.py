"""Tensors of one dtype laid end to end in one flat host buffer, so that many small tensors travel as one operation.

Both packed grouped allreduces and DistributedOptimizer's gradient buckets use it. The copies in and out are the
core's (hvdlite_gather_bytes and hvdlite_scatter_bytes) where the tensors are contiguous: torch's copies of many
small CPU tensors pay a dispatch each. Strided tensors are copied by torch, element by element.
"""

from typing import Sequence

import torch

from hvdlite.common import ops


class FlatLayout:
    def __init__(self, shapes: Sequence[torch.Size], dtype: torch.dtype):
        self.shapes = list(shapes)
        numels = [s.numel() for s in self.shapes]
        self.flat = torch.empty(sum(numels), dtype=dtype)
        self.views = [v.view(s) for v, s in zip(self.flat.split(numels), self.shapes)]
        self.nbytes = ops.ffi.new("int64_t[]", [n * self.flat.element_size() for n in numels])

    def digest(self) -> int:
        """The layout as the core compares it across ranks (hvdlite_request.layout)."""
        return ops.layout_digest(self.shapes)

    @staticmethod
    def addresses(tensors: Sequence[torch.Tensor]):
        """The tensors' data addresses (ops.address_array()'s, for pack and unpack), or None if one is not
        contiguous."""
        if all(t.is_contiguous() for t in tensors):
            return ops.address_array([t.data_ptr() for t in tensors])
        return None

    def pack(self, tensors: Sequence[torch.Tensor], addresses) -> None:
        """Copies tensors (whose addresses() are given) into the flat buffer."""
        if addresses is not None:
            ops.gather_bytes(self.flat.data_ptr(), addresses, self.nbytes)
        else:  # outside autograd, as the core's copies are
            with torch.no_grad():
                torch._foreach_copy_(self.views, list(tensors))

    def unpack(self, tensors: Sequence[torch.Tensor], addresses) -> None:
        """Copies the flat buffer back into tensors (whose addresses() are given)."""
        if addresses is not None:
            ops.scatter_bytes(self.flat.data_ptr(), addresses, self.nbytes)
        else:
            with torch.no_grad():
                torch._foreach_copy_(list(tensors), self.views)
