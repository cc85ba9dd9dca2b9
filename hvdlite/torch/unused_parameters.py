"""Parameters that no rank gave a gradient in a step keep none, as under DDP with find_unused_parameters=True.

A rank without a gradient for a parameter reduces zeros in its place, so that the others do not wait, and the
average comes out right where some ranks had one. Where no rank had one, those zeros would reach the wrapped
optimizer, whose momentum and weight decay would then move a parameter that single-process training leaves alone.
So every step the ranks add up how many gradients each lacked: one 4-byte allreduce, queued with the step's
gradients. Only when that sum is not zero do they exchange which ones they lacked, and drop the gradients of those
that nobody had."""

from typing import Sequence

import torch

from hvdlite.common.ops import Max, Sum
from hvdlite.torch import mpi_ops


class UnusedParameters:
    def __init__(self, name: str, process_set):
        self._name, self._process_set = name, process_set
        self._count = torch.zeros(1, dtype=torch.int32)
        self._count_view = self._count.numpy()  # (a numpy item access costs a tenth of torch's)

    def submit(self, lacking: int):
        """Queues this rank's count of parameters it had no gradient for; every member calls it every step."""
        self._count_view[0] = lacking
        return mpi_ops.allreduce_async_(self._count, name=self._name, op=Sum, process_set=self._process_set)

    def finish(self, handle, params: Sequence[torch.Tensor], lacking: Sequence[torch.Tensor]) -> None:
        """After the step's gradients are reduced: sets .grad to None where no rank had a gradient. lacking holds
        this rank's parameters that had none (their .grad now the reduced zeros)."""
        mpi_ops.synchronize(handle)
        if self._count_view[0] == 0:
            return
        had = torch.ones(len(params), dtype=torch.uint8)
        position = {id(p): i for i, p in enumerate(params)}
        for p in lacking:
            had[position[id(p)]] = 0
        # Named by the count too: a parameter list that changed length does not meet its old cached layout.
        had = mpi_ops.allreduce(had, name=f"{self._name}.which.{len(params)}", op=Max, process_set=self._process_set)
        for i in torch.nonzero(had == 0).flatten().tolist():
            params[i].grad = None
