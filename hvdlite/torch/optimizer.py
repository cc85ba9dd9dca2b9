"""DistributedOptimizer: wraps a torch optimizer so that each gradient is averaged over the ranks while the
rest of backward still runs (horovod.torch.DistributedOptimizer semantics).

As soon as autograd has accumulated a parameter's gradient (post-accumulate-grad hook), its allreduce is
enqueued asynchronously under the parameter's name; the core negotiates, fuses and reduces it in the background.
step() (or synchronize()) waits for all of them. Every rank submits the same names every step: a parameter
that received no gradient on some rank is reduced with zeros there, so no rank waits for a tensor another rank
will never send.
"""
import contextlib
import warnings
from typing import Dict, List, Optional

import torch

from hvdlite.common.basics import global_process_set, size
from hvdlite.common.ops import Average, Sum
from hvdlite.torch import mpi_ops
from hvdlite.torch.compression import Compression


class _DistributedOptimizer:
    """Mixin placed in front of the wrapped optimizer's class (see DistributedOptimizer)."""

    def _hvd_setup(self, named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                   groups, sparse_as_dense, process_set):
        if op not in (Average, Sum):
            raise ValueError("DistributedOptimizer supports op=Average or op=Sum")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
                raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                                 "usually model.named_parameters()")
            names = [n for n, _ in named]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {duplicates}")
            by_param = {id(p): n for n, p in named}
            unnamed = [i for i, p in enumerate(params) if id(p) not in by_param]
            if unnamed:
                raise ValueError("named_parameters was given, but the optimizer has parameters it does not name "
                                 f"(positions {unnamed[:10]} in param_groups); pass model.named_parameters() of "
                                 "the model whose parameters the optimizer updates")
            self._hvd_names = {id(p): f"allreduce.{by_param[id(p)]}" for p in params}
        else:
            # Positions are identical on every rank for the same model, so these names repeat step after step
            # and the response cache applies.
            self._hvd_names = {id(p): f"allreduce.param.{i}" for i, p in enumerate(params)}
        self._hvd_compression = compression
        self._hvd_passes = backward_passes_per_step
        self._hvd_op = op
        self._hvd_predivide = gradient_predivide_factor
        self._hvd_sparse_as_dense = sparse_as_dense
        self._hvd_process_set = process_set
        self._hvd_params = [p for p in params if p.requires_grad]
        self._hvd_passes_left: Dict[int, int] = {id(p): backward_passes_per_step for p in self._hvd_params}
        self._hvd_handles: Dict[int, tuple] = {}
        self._hvd_synchronized = False
        self._hvd_should_synchronize = True
        self._hvd_group_of: Dict[int, int] = {}
        self._hvd_group_ready: Dict[int, List[torch.Tensor]] = {}
        self._hvd_group_size: Dict[int, int] = {}
        if groups is not None:
            self._hvd_assign_groups(groups)
        self._hvd_hooks = [p.register_post_accumulate_grad_hook(self._hvd_on_grad) for p in self._hvd_params]

    def _hvd_assign_groups(self, groups):
        if isinstance(groups, int):
            if groups <= 0:
                raise ValueError("groups must be a positive number of groups or a list of parameter lists")
            per = -(-len(self._hvd_params) // groups)
            partition = [self._hvd_params[i:i + per] for i in range(0, len(self._hvd_params), per)]
        else:
            partition = [list(g) for g in groups]
        for index, members in enumerate(partition):
            for p in members:
                if id(p) in self._hvd_group_of:
                    raise ValueError("a parameter appears in more than one group")
                self._hvd_group_of[id(p)] = index
            self._hvd_group_size[index] = len(members)
            self._hvd_group_ready[index] = []

    # ------------------------------------------------------------------ hooks and reduction

    def _hvd_on_grad(self, p: torch.Tensor) -> None:
        key = id(p)
        if key in self._hvd_handles:
            raise AssertionError(
                "gradients were computed more than backward_passes_per_step times before step(); raise "
                "backward_passes_per_step to accumulate gradients locally over several backward passes")
        self._hvd_passes_left[key] -= 1
        if self._hvd_passes_left[key] > 0:
            return
        group = self._hvd_group_of.get(key)
        if group is None:
            self._hvd_handles[key] = self._hvd_reduce_async(p)
            return
        ready = self._hvd_group_ready[group]
        ready.append(p)
        if len(ready) == self._hvd_group_size[group]:
            for q in ready:
                self._hvd_handles[id(q)] = self._hvd_reduce_async(q)
            ready.clear()

    def _hvd_reduce_async(self, p: torch.Tensor) -> tuple:
        name = self._hvd_names[id(p)]
        if p.grad is None:  # no gradient on this rank this step: contribute zeros so others do not wait
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if self._hvd_sparse_as_dense:
                p.grad = grad = grad.to_dense()
            else:
                return self._hvd_sparse_async(p, name)
        prescale, postscale = 1.0, 1.0
        if self._hvd_op == Average and self._hvd_predivide != 1.0:
            prescale, postscale = 1.0 / self._hvd_predivide, self._hvd_predivide
        wire, ctx = self._hvd_compression.compress(grad)
        if wire is grad and not grad.is_contiguous():
            wire = grad.contiguous()
        handle = mpi_ops.allreduce_async_(wire, name=name, op=self._hvd_op, prescale_factor=prescale,
                                          postscale_factor=postscale, process_set=self._hvd_process_set)
        return ("dense", handle, wire, ctx)

    def _hvd_sparse_async(self, p, name):
        grad = p.grad.coalesce()
        values = mpi_ops.allgather_async(grad._values(), name=f"{name}.values", process_set=self._hvd_process_set)
        indices = mpi_ops.allgather_async(grad._indices().t().contiguous(), name=f"{name}.indices",
                                          process_set=self._hvd_process_set)
        return ("sparse", values, indices, grad.shape)

    def _hvd_finish(self, p: torch.Tensor, pending: tuple) -> None:
        if pending[0] == "dense":
            _, handle, wire, ctx = pending
            result = mpi_ops.synchronize(handle)
            if result is not p.grad:
                p.grad.copy_(self._hvd_compression.decompress(result, ctx))
            return
        _, values_handle, indices_handle, shape = pending
        values = mpi_ops.synchronize(values_handle)
        indices = mpi_ops.synchronize(indices_handle)
        if self._hvd_op == Average:
            values = values / (self._hvd_process_set.size() if self._hvd_process_set.process_set_id else size())
        p.grad = torch.sparse_coo_tensor(indices.t(), values, shape).coalesce()

    # ------------------------------------------------------------------ public API

    def synchronize(self) -> None:
        """Waits until every gradient is reduced (reducing, with zeros, those this rank did not produce)."""
        for p in self._hvd_params:
            if id(p) not in self._hvd_handles:
                self._hvd_handles[id(p)] = self._hvd_reduce_async(p)
        for group in self._hvd_group_ready.values():
            group.clear()
        errors = []
        for p in self._hvd_params:
            try:
                self._hvd_finish(p, self._hvd_handles[id(p)])
            except Exception as e:  # noqa: BLE001 - wait for the rest, then re-raise the first
                errors.append(e)
        self._hvd_handles.clear()
        for p in self._hvd_params:
            self._hvd_passes_left[id(p)] = self._hvd_passes
        self._hvd_synchronized = True
        if errors:
            raise errors[0]

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Use after an explicit synchronize() (e.g. to clip gradients) so that step() does not reduce again."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    def step(self, closure=None):
        if self._hvd_should_synchronize:
            if self._hvd_synchronized:
                warnings.warn("optimizer.step() was called after optimizer.synchronize() without "
                              "optimizer.skip_synchronize(); gradients are reduced again, which is wasted work")
            self.synchronize()
        self._hvd_synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True):
        if self._hvd_handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(); the gradients are still being reduced in place, so this is not allowed")
        return super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1, op=Average,
                         gradient_predivide_factor: float = 1.0, groups=None, sparse_as_dense: bool = False,
                         process_set=global_process_set):
    """Returns optimizer, now averaging gradients over the ranks of process_set (Horovod's signature).

    The optimizer object is kept (its state and hyper-parameters stay); its class becomes a subclass of the
    original with the distributed step(), synchronize(), skip_synchronize() and zero_grad() checks.
    """
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    base = optimizer.__class__
    optimizer.__class__ = type(base.__name__, (_DistributedOptimizer, base), {})
    optimizer._hvd_setup(named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                         groups, sparse_as_dense, process_set)
    return optimizer
