"""DistributedOptimizer: wraps a torch optimizer so that each gradient is averaged over the ranks while the
rest of backward still runs (horovod.torch.DistributedOptimizer semantics).

As soon as autograd has accumulated a parameter's gradient (post-accumulate-grad hook), its allreduce is
enqueued asynchronously under the parameter's name; the core negotiates, fuses and reduces it in the background.
step() (or synchronize()) waits for all of them. Every rank submits the same names every step: a parameter
that received no gradient on some rank is reduced with zeros there, so no rank waits for a tensor another rank
will never send.

Where reducing during backward pays, and where the hooks only note a gradient's readiness for synchronize() to
submit, is backward_policy.py's choice.

Sparse gradients (nn.Embedding(sparse=True)) stay sparse: their indices and values are allgathered
(sparse_allreduce_async), or with sparse_as_dense=True allreduced as a dense tensor and made sparse again, so
optimizers that need sparse gradients (torch.optim.SparseAdam) work either way, as in Horovod. Usage errors and
warnings carry Horovod's messages and categories, since scripts and their tests match on them.

compression=hvd.Compression.powersgd(...) or hvd.Compression.topk(...) hands every gradient to a reducer in
synchronize() instead (hvdlite.torch.gradient_reducers): fewer bytes on the wire, with error feedback.
sync_every=k averages parameters every k steps instead of gradients every step (hvdlite.torch.local_sgd).
staleness=s lets each step's allreduce run during the next s steps and applies it then (hvdlite.torch.staleness).
"""

import contextlib
import time
import warnings
import weakref
from typing import Dict, List, Optional

import torch

from hvdlite.common.basics import global_process_set
from hvdlite.common.ops import Adasum, Average, Sum
from hvdlite.torch import (
    backward_policy,
    core_ops,
    grad_scaler,
    gradient_buckets,
    gradient_hooks,
    gradient_reducers,
    mpi_ops,
    sharded_state,
    unused_parameters,
)
from hvdlite.torch.compression import Compression
from hvdlite.torch.local_sgd import LocalSGD
from hvdlite.torch.pending_gradients import BATCHED, DEFERRED, DenseReduction, FailedSubmission, SparseReduction
from hvdlite.torch.staleness import BoundedStaleness


class _DistributedOptimizer:
    """Mixin placed in front of the wrapped optimizer's class (see DistributedOptimizer)."""

    def _hvd_setup(
        self,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
        reduce_during_backward=None,
        local_sgd=None,
        staleness=None,
        shard_optimizer_state=False,
    ):
        if op == Adasum:
            raise NotImplementedError(
                "DistributedOptimizer(op=hvd.Adasum) is Horovod's delta-based Adasum optimizer, which hvdlite does "
                "not implement; hvd.allreduce(op=hvd.Adasum) reduces tensors with Adasum"
            )
        if op not in (Average, Sum):
            raise ValueError("DistributedOptimizer supports op=Average or op=Sum")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
                raise ValueError(
                    "named_parameters should be a sequence of (name, parameter) tuples, "
                    "usually model.named_parameters()"
                )
            names = [n for n, _ in named]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {duplicates}")
            by_param = {id(p): n for n, p in named}
            unnamed = [i for i, p in enumerate(params) if id(p) not in by_param]
            if unnamed:
                raise ValueError(
                    "named_parameters was given, but the optimizer has parameters it does not name "
                    f"(positions {unnamed[:10]} in param_groups); pass model.named_parameters() of "
                    "the model whose parameters the optimizer updates"
                )
            self._hvd_names = {id(p): f"allreduce.{by_param[id(p)]}" for p in params}
        else:
            # Positions are identical on every rank for the same model, so these names repeat step after step
            # and the response cache applies.
            self._hvd_names = {id(p): f"allreduce.param.{i}" for i, p in enumerate(params)}
        # Horovod's optimizer exposes this mapping (parameter to name); user code and Horovod's tests read it.
        self._parameter_names = {p: self._hvd_names[id(p)][len("allreduce.") :] for p in params}
        self._hvd_compression = Compression.none if compression is None else compression
        # A reducer (PowerSGD, top-k) takes every gradient at once in synchronize() and keeps state across steps.
        self.gradient_reducer = None
        if gradient_reducers.is_reducer(compression):
            if gradient_predivide_factor != 1.0:
                raise ValueError(f"gradient_predivide_factor is not supported with {compression!r}")
            names = {id(p): self._parameter_names[p] for p in params}
            self.gradient_reducer = compression.build(names, process_set, op, mpi_ops)
            self._hvd_compression = Compression.none
        self.local_sgd = None
        if local_sgd is not None:
            if self.gradient_reducer is not None:
                raise ValueError(f"sync_every (local SGD) and {compression!r} cannot be combined")
            if op != Average:
                raise ValueError("sync_every (local SGD) averages parameters: it needs op=Average")
            names = {id(p): self._parameter_names[p] for p in params}
            self.local_sgd = LocalSGD(
                [p for p in params if p.requires_grad], names, self, process_set, mpi_ops, **local_sgd
            )
        self.bounded_staleness = None
        if staleness is not None:
            if self.gradient_reducer is not None or self.local_sgd is not None:
                other = "sync_every (local SGD)" if self.local_sgd is not None else repr(compression)
                raise ValueError(f"staleness and {other} cannot be combined")
            prescale, postscale = self._hvd_scale_factors(op, gradient_predivide_factor)
            self.bounded_staleness = BoundedStaleness(
                [p for p in params if p.requires_grad],
                process_set,
                op,
                self._hvd_compression,
                prescale,
                postscale,
                mpi_ops,
                staleness,
            )
        self._hvd_stale_apply = True
        self._hvd_passes = backward_passes_per_step
        self._hvd_op = op
        self._hvd_predivide = gradient_predivide_factor
        self._hvd_sparse_as_dense = sparse_as_dense
        self._hvd_process_set = process_set
        self._hvd_params = [p for p in params if p.requires_grad]
        # Frozen parameters, watched at each step: one that becomes trainable (a layer unfrozen part way through
        # training) is taken in, where reducing only what was trainable at construction let the ranks drift apart.
        self._hvd_frozen = [p for p in params if not p.requires_grad]
        self._hvd_param_of = {id(p): p for p in self._hvd_params}
        self._hvd_passes_left: Dict[int, int] = {id(p): backward_passes_per_step for p in self._hvd_params}
        self._hvd_handles: Dict[int, tuple] = {}
        # What the hook in C takes for the rest of a backward pass (gradient_hooks.py): [mode, bucket by parameter id,
        # gradients each bucket awaits, what a bucket's last gradient calls], set by _hvd_note_hook_case and at
        # each pass's first gradient (_hvd_route_pass).
        self._hvd_hook_route = [0, {}, [], None]
        self._hvd_routed_buckets = None  # the buckets the route counts gradients into
        self._hvd_buckets = None  # gradient_buckets.GradientBuckets, built at the first step that can use them
        self._hvd_buckets_set = None  # the process set id they were built for
        self._hvd_sparse_ids = set()  # parameters whose gradients came sparse: reduced on their own
        self._hvd_synchronized = False
        self._hvd_reduced_for_scaler = False  # a GradScaler's unscale_ waited for this step's reductions
        self._hvd_should_synchronize = True
        self._hvd_group_of: Dict[int, int] = {}
        self._hvd_group_ready: Dict[int, List[torch.Tensor]] = {}
        self._hvd_group_size: Dict[int, int] = {}
        if groups is not None:
            self._hvd_assign_groups(groups)
        # Like Horovod, a rank outside process_set reduces nothing: its step() applies its own gradients.
        if process_set.process_set_id is None:
            raise ValueError(f"{process_set} is not registered; call hvd.add_process_set first")
        self._hvd_member = bool(process_set.included())
        # CUDA gradients are reduced by the device while the host runs backward: always worth overlapping.
        self._hvd_overlap = self.bounded_staleness is None and (
            backward_policy.reduce_during_backward(reduce_during_backward) or any(p.is_cuda for p in self._hvd_params)
        )
        self._hvd_note_hook_case()
        self._hvd_hook = gradient_hooks.gradient_hook(self)
        self._hvd_hooks = gradient_hooks.hook_parameters(self._hvd_params, self._hvd_hook) if self._hvd_member else []
        # A discarded optimizer stops hearing of gradients.
        weakref.finalize(self, gradient_hooks.remove_hooks, self._hvd_hooks)
        # Named after its first parameter: two optimizers (a GAN's) keep apart in the core's cache.
        first = self._hvd_names[id(self._hvd_params[0])] if self._hvd_params else "none"
        self._hvd_unused = unused_parameters.UnusedParameters(f"unused.{first}", process_set)
        self._hvd_sharded = None
        if shard_optimizer_state:
            for other, given in (
                ("sync_every (local SGD)", local_sgd is not None),
                ("staleness", staleness is not None),
            ):
                if given:
                    raise ValueError(f"shard_optimizer_state and {other} cannot be combined")
            if self._hvd_member:  # a rank outside the set steps every parameter itself, as without sharding
                self._hvd_sharded = sharded_state.ShardedState(
                    self, self._hvd_params, process_set, f"sharded.{first}"
                )

    def _hvd_assign_groups(self, groups):
        if isinstance(groups, bool) or not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
        if isinstance(groups, int):
            per = -(-len(self._hvd_params) // groups)
            partition = [self._hvd_params[i : i + per] for i in range(0, len(self._hvd_params), per)]
        else:
            partition = [list(g) for g in groups]
        for index, members in enumerate(partition):
            for p in members:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in self._hvd_group_of:
                    raise ValueError("A parameter can only appear once in groups.")
                self._hvd_group_of[id(p)] = index
            self._hvd_group_size[index] = len(members)
            self._hvd_group_ready[index] = []

    # ------------------------------------------------------------------ hooks and reduction

    def _hvd_note_hook_case(self) -> None:
        # One backward pass a step, no local SGD, groups, reducer or overlap: every gradient waits for
        # synchronize(), and the hook has nothing to count or decide.
        self._hvd_defers_every_gradient = (
            self._hvd_passes == 1
            and self.local_sgd is None
            and not self._hvd_group_of
            and not self._hvd_overlap
            and self.gradient_reducer is None
        )
        self._hvd_hook_route[0] = 1 if self._hvd_defers_every_gradient else 0

    def _hvd_stepping_locally(self) -> bool:
        return self.local_sgd is not None and not self.local_sgd.synchronous_now()

    def _hvd_on_grad(self, p: torch.Tensor) -> None:
        # Runs once per parameter per backward pass: the plain case (one pass a step, everything reduced from
        # synchronize()) only records that the gradient is final.
        key = id(p)
        handles = self._hvd_handles
        if key in handles:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to "
                "step(). Increase backward_passes_per_step to accumulate gradients locally."
            )
        if self._hvd_defers_every_gradient:
            self._hvd_reduced_for_scaler = False  # a new pass, perhaps after a step the scaler skipped
            handles[key] = DEFERRED
            return
        if not handles:
            self._hvd_route_pass()
        if self.local_sgd is not None and self._hvd_stepping_locally():
            return
        if self._hvd_reduced_for_scaler:
            self._hvd_reduced_for_scaler = False
        passes_left = self._hvd_passes_left
        left = passes_left[key] - 1
        passes_left[key] = left
        if left > 0:
            return
        group = self._hvd_group_of.get(key) if self._hvd_group_of else None
        if group is None:
            if self._hvd_overlap or self.gradient_reducer is not None:
                self._hvd_submit(p)
            else:
                handles[key] = DEFERRED  # submitted by synchronize(), in this order
            return
        ready = self._hvd_group_ready[group]
        ready.append(p)
        if len(ready) == self._hvd_group_size[group]:
            for q in ready:
                self._hvd_submit(q)
            ready.clear()

    def _hvd_route_pass(self) -> None:
        # A pass's first gradient: where one backward pass makes a step and every gradient goes through the buckets
        # as it comes, the hook in C counts the rest of the pass into them (mode 2); anything else stays here.
        route = self._hvd_hook_route
        route[0] = 0
        if (
            self._hvd_passes != 1
            or self.local_sgd is not None
            or self._hvd_group_of
            or not self.reduces_during_backward
        ):
            return
        try:
            buckets = self._hvd_bucketed()
        except Exception:  # noqa: BLE001 - e.g. hvdlite stopped: _hvd_submit meets it again and records it
            return
        if buckets is not None:
            self._hvd_routed_buckets = buckets
            route[1], route[2], route[0] = buckets.bucket_of, buckets.waiting, 2

    def _hvd_bucket_full(self, index: int, p: torch.Tensor) -> None:
        # The hook in C counted bucket index's last gradient (p's): queue the bucket, or reduce alone the members
        # that do not fit it, as _hvd_submit does with what ready() refuses.
        handles = self._hvd_handles
        try:
            misfits = self._hvd_routed_buckets.bucket_full(index)
        except Exception as e:  # noqa: BLE001 - as in _hvd_submit: synchronize() raises it
            handles[id(p)] = FailedSubmission(e)
            return
        for q in misfits:
            try:
                handles[id(q)] = self._hvd_reduce_async(q)
            except Exception as e:  # noqa: BLE001 - as in _hvd_submit
                handles[id(q)] = FailedSubmission(e)

    @property
    def reduces_during_backward(self) -> bool:
        """Whether this step's gradients are submitted as backward produces them (else all at once in step())."""
        return self._hvd_overlap and not self._hvd_compresses_this_step()

    def _hvd_compresses_this_step(self) -> bool:
        # A reducer takes the whole step only when it compresses it; its other steps go the usual way.
        return self.gradient_reducer is not None and self.gradient_reducer.compresses_next()

    def _hvd_submit(self, p: torch.Tensor) -> None:
        # Deferred entries keep the order backward produced them in (dicts keep insertion order).
        if not self.reduces_during_backward:
            self._hvd_handles[id(p)] = DEFERRED
            return
        try:
            buckets = self._hvd_bucketed()
            if buckets is not None and buckets.covers(p) and buckets.ready(p):
                self._hvd_handles[id(p)] = BATCHED
            else:
                self._hvd_handles[id(p)] = self._hvd_reduce_async(p)
        except Exception as e:  # noqa: BLE001 - hvdlite stopped (a peer failed): synchronize() raises it, so
            self._hvd_handles[id(p)] = FailedSubmission(e)  # backward completes and the step ends cleanly

    # The plain case (host gradients reduced as they are, no compression or reducer) goes through gradient buckets
    # (gradient_buckets.py): a step is a few prepared operations, queued and waited for in one call each. Anything
    # else, and any gradient that does not fit the buckets' layout, takes _hvd_reduce_async, one at a time.

    def _hvd_bucketed(self):
        """The gradient buckets, built at the first step that can use them; None where the plain case does not
        hold."""
        buckets = self._hvd_buckets
        # Built between steps only: once a step has queued through them, they serve it to its end (a stale
        # layout hands what does not fit back to be reduced alone, and _hvd_end_step drops it).
        if buckets is None or (
            self._hvd_buckets_set != self._hvd_process_set.process_set_id
            and not any(pending is BATCHED for pending in self._hvd_handles.values())
        ):
            if self.gradient_reducer is not None or self._hvd_compression is not Compression.none:
                return None
            if not all(p.is_cpu for p in self._hvd_params):
                return None
            prescale, postscale = self._hvd_scale_factors(self._hvd_op, self._hvd_predivide)
            op, process_set = self._hvd_op, self._hvd_process_set

            def request_for(tensor, name):
                return core_ops._allreduce_request(tensor, tensor, name, op, prescale, postscale, process_set)

            sparse = self._hvd_sparse_ids
            dense = [p for p in self._hvd_params if id(p) not in sparse and (p.grad is None or not p.grad.is_sparse)]
            buckets = self._hvd_buckets = gradient_buckets.GradientBuckets(dense, self._hvd_names, request_for)
            self._hvd_buckets_set = process_set.process_set_id
        return buckets

    def _hvd_reduce_async(self, p: torch.Tensor):
        name = self._hvd_names[id(p)]
        if p.grad is None:  # no gradient on this rank this step: contribute zeros so others do not wait
            p.grad = torch.zeros_like(p)
        if self.gradient_reducer is not None and not self._hvd_sparse_as_dense:
            self.gradient_reducer.check_dense(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._hvd_sparse_as_dense:
                return SparseReduction(
                    mpi_ops.sparse_allreduce_async(
                        grad, name=name, op=self._hvd_op, process_set=self._hvd_process_set
                    )
                )
            grad = grad.to_dense()  # reduced dense; _hvd_finish makes p.grad sparse again
        if self.gradient_reducer is not None:
            self.gradient_reducer.add_residual(p, grad)  # a compressing reducer's last residual goes out with it
        prescale, postscale = self._hvd_scale_factors(self._hvd_op, self._hvd_predivide)
        wire, ctx = self._hvd_compression.compress(grad)
        if wire is grad and not grad.is_contiguous():
            wire = grad.contiguous()
        handle = mpi_ops.allreduce_async_(
            wire,
            name=name,
            op=self._hvd_op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=self._hvd_process_set,
        )
        return DenseReduction(handle, wire, ctx)

    @staticmethod
    def _hvd_scale_factors(op, predivide: float) -> tuple:
        if op == Average and predivide != 1.0:
            return 1.0 / predivide, predivide
        return 1.0, 1.0

    def _hvd_finish(self, p: torch.Tensor, pending) -> None:
        # One place where a gradient's exchange ends (a test slows it down here to stand in for a slow link).
        pending.finish(p, self._hvd_compression)

    # ------------------------------------------------------------------ public API

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes how many backward passes accumulate locally before gradients are reduced."""
        if passes < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._hvd_passes = passes
        for p in self._hvd_params:
            self._hvd_passes_left[id(p)] = passes
        self._hvd_note_hook_case()

    @property
    def backward_passes_per_step(self) -> int:
        return self._hvd_passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        self.set_backward_passes_per_step(passes)

    def synchronize(self) -> None:
        """Waits until every gradient is reduced (reducing, with zeros, those this rank did not produce)."""
        if self._hvd_frozen and self._hvd_member:
            self._hvd_take_unfrozen()
        if self._hvd_stepping_locally():
            return  # nothing to reduce: the parameters are averaged after the period's last step
        if not self._hvd_member:
            self._hvd_synchronized = True
            return
        if self._hvd_compresses_this_step():
            self._hvd_synchronize_with_reducer()
            return
        if self.bounded_staleness is not None:
            try:
                self._hvd_stale_apply = self.bounded_staleness.exchange()
            finally:
                self._hvd_end_step()
            return
        errors = []
        began = time.perf_counter()
        all_batched = False  # every gradient went through the buckets
        frozen_now = []  # parameters switched off since the last step: zeros this step, then no longer reduced
        lacking = []  # parameters without a gradient on this rank this step: zeros this step
        unused = None  # the exchange that finds those without one on any rank
        try:
            handles = self._hvd_handles
            # A parameter without a gradient on this rank this step contributes zeros, so others do not wait (the
            # hooks' keys are these parameters': when every one has an entry, there is none to look for).
            if len(handles) < len(self._hvd_params):
                for p in self._hvd_params:
                    if id(p) not in handles:
                        if p.grad is None:
                            (lacking if p.requires_grad else frozen_now).append(p)
                            p.grad = torch.zeros_like(p)
                        handles[id(p)] = DEFERRED
            unused = self._hvd_unused.submit(len(lacking))
            buckets = self._hvd_bucketed()
            if buckets is not None:
                # Everything not queued during backward, through the buckets in one call; what does not fit them
                # one by one. Bucketed gradients are finished in place by buckets.wait().
                alone = buckets.submit_rest()
                for p in alone:
                    handles[id(p)] = self._hvd_reduce_async(p)
                # Where the hooks only deferred, and the buckets lay out every parameter and took them all, every
                # entry left DEFERRED is batched: no need to mark them one by one.
                all_batched = (
                    self._hvd_defers_every_gradient and not alone and buckets.parameter_count == len(handles)
                )
                for key, pending in () if all_batched else handles.items():
                    if pending is DEFERRED:
                        p = self._hvd_param_of[key]
                        handles[key] = BATCHED if buckets.covers(p) else self._hvd_reduce_async(p)
            else:  # in the order backward produced them
                for key, pending in handles.items():
                    if pending is DEFERRED:
                        handles[key] = self._hvd_reduce_async(self._hvd_param_of[key])
        except Exception as e:  # noqa: BLE001 - e.g. hvdlite stopped after a peer failed: still end the step
            errors.append(e)
        if self._hvd_buckets is not None:
            try:
                self._hvd_buckets.wait()
            except Exception as e:  # noqa: BLE001 - the first error is raised once every gradient is done
                errors.append(e)
        # What did not go through the batch is finished one by one (usually nothing).
        unbatched = not all_batched and any(pending is not BATCHED for pending in self._hvd_handles.values())
        for p in self._hvd_params if unbatched else ():
            pending = self._hvd_handles.get(id(p))
            if pending is None or pending is DEFERRED or pending is BATCHED:  # not submitted (the error above
                continue  # says why), or finished in place through the batch
            try:
                self._hvd_finish(p, pending)
            except Exception as e:  # noqa: BLE001 - wait for the rest, then re-raise the first
                errors.append(e)
        if unused is not None:
            try:
                self._hvd_unused.finish(unused, self._hvd_params, lacking)
            except Exception as e:  # noqa: BLE001 - e.g. a peer failed: raised with the others
                errors.append(e)
        if frozen_now:
            self._hvd_let_go(frozen_now)
        self._hvd_end_step()
        if errors:
            raise errors[0]
        if self.gradient_reducer is not None:
            self.gradient_reducer.plain_step_done(self._hvd_params, waited=time.perf_counter() - began)

    def _hvd_end_step(self) -> None:
        # Whatever failed, the step is over: the next zero_grad() and backward() start afresh (elastic training
        # restores the state and carries on with the same optimizer).
        self._hvd_handles.clear()
        for group in self._hvd_group_ready.values():
            group.clear()
        if not self._hvd_defers_every_gradient:  # (else the hook leaves the counts alone)
            self._hvd_passes_left = dict.fromkeys(self._hvd_param_of, self._hvd_passes)
        if self._hvd_buckets is not None and self._hvd_buckets.stale:
            # A parameter changed its layout or gave a sparse gradient: the next step lays them out anew.
            self._hvd_sparse_ids |= self._hvd_buckets.sparse
            self._hvd_buckets = None
        self._hvd_synchronized = True

    def _hvd_synchronize_with_reducer(self) -> None:
        sparse = {}
        try:
            for p in self._hvd_params:
                if p.grad is None:  # no gradient on this rank this step: contribute zeros so others do not wait
                    p.grad = torch.zeros_like(p)
                elif p.grad.is_sparse and self._hvd_sparse_as_dense:
                    sparse[id(p)] = p.grad.sparse_dim()
                    p.grad = p.grad.to_dense()
            self.gradient_reducer.reduce(self._hvd_params)
            for p in self._hvd_params:
                if id(p) in sparse:
                    p.grad = p.grad.to_sparse(sparse[id(p)])
        finally:
            self._hvd_end_step()

    def _hvd_reduce_before_unscale(self) -> None:
        """Called by GradScaler.unscale_ (grad_scaler.py): the step's gradients are averaged before the scaler
        reads them, so every rank finds the same infs and skips or steps with the others."""
        if self._hvd_synchronized or self._hvd_reduced_for_scaler or not self._hvd_member:
            return  # synchronized by the caller (Horovod's pattern), or already for this scaler
        if self._hvd_stepping_locally() or self.bounded_staleness is not None:
            return  # no average to wait for before this step
        self.synchronize()
        self._hvd_synchronized = False  # not the caller's synchronize(): step() neither warns nor reduces again
        self._hvd_reduced_for_scaler = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Use after an explicit synchronize() (e.g. to clip gradients) so that step() does not reduce again."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    def step(self, closure=None):
        if self._hvd_stepping_locally():
            result = super().step(closure)
            if self._hvd_member:
                self.local_sgd.after_step()
            return result
        if self._hvd_should_synchronize and not self._hvd_reduced_for_scaler:
            if self._hvd_synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                    "your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._hvd_synchronized = False
        self._hvd_reduced_for_scaler = False
        if not self._hvd_stale_apply:  # bounded staleness, first steps: no average has arrived yet
            self._hvd_stale_apply = True
            return None
        if self._hvd_sharded is not None:
            return self._hvd_sharded.step(super().step, closure)
        result = super().step(closure)
        if self.local_sgd is not None and self._hvd_member:
            self.local_sgd.after_step()
        return result

    # ------------------------------------------------------------------ sharded optimizer state

    def consolidate_state_dict(self, to: Optional[int] = 0) -> None:
        """With shard_optimizer_state=True: gathers the whole optimizer state on global rank `to` (collective over
        the process set), whose state_dict() then returns it (torch's ZeroRedundancyOptimizer's method); to=None
        gathers it on every rank. Without sharding every rank already has the whole state: nothing to do."""
        if self._hvd_sharded is not None:
            self._hvd_sharded.consolidate(super().state_dict, to)

    def state_dict(self):
        if self._hvd_sharded is not None:
            return self._hvd_sharded.state_dict()
        return super().state_dict()

    def load_state_dict(self, state_dict) -> None:
        """Loads a whole (unsharded) state dict; with shard_optimizer_state=True this rank keeps its part."""
        super().load_state_dict(state_dict)
        if self._hvd_sharded is not None:
            self._hvd_sharded.keep_own_state()

    def optimizer_state_bytes(self) -> int:
        """Bytes of the tensors in this rank's optimizer state (with shard_optimizer_state=True, its share)."""
        return sharded_state.state_bytes(self)

    def drain(self) -> int:
        """With staleness=s: waits for the averages still in flight (the last s steps') and applies each with an
        optimizer step, oldest first; returns how many it applied. Call it before evaluating or saving the final
        model. Without staleness there is nothing in flight after step(), and it returns 0."""
        applied = 0
        if self.bounded_staleness is not None and self._hvd_member:
            for _ in self.bounded_staleness.drain():
                super().step()
                applied += 1
        return applied

    def _hvd_pending(self) -> bool:
        """Reductions in flight, or backward passes counted towards the next reduction (as in Horovod, both
        forbid zero_grad: clearing a partly accumulated gradient would desynchronise the ranks' counts)."""
        if self._hvd_handles:
            return True
        return not self._hvd_defers_every_gradient and any(
            left != self._hvd_passes for left in self._hvd_passes_left.values()
        )

    def _hvd_state_per_parameter(self) -> Optional[str]:
        """The option, if any, whose state is laid out for the parameters given at construction."""
        for option, given in (
            ("a compressing reducer (PowerSGD, top-k)", self.gradient_reducer is not None),
            ("sync_every (local SGD)", self.local_sgd is not None),
            ("staleness", self.bounded_staleness is not None),
            ("shard_optimizer_state", self._hvd_sharded is not None),
        ):
            if given:
                return option
        return None

    def _hvd_take_in(self, params) -> None:
        """Reduces params (trainable now) from here on: hooked, and laid out in the buckets from the next step."""
        self._hvd_params += params
        self._hvd_param_of.update((id(p), p) for p in params)
        self._hvd_passes_left.update((id(p), self._hvd_passes) for p in params)
        if self._hvd_member:
            # (into the list the finalizer removes)
            self._hvd_hooks += gradient_hooks.hook_parameters(params, self._hvd_hook)
        if self._hvd_buckets is not None:
            self._hvd_buckets.stale = True  # this step they go alone; the next lays them out with the rest

    def _hvd_let_go(self, frozen) -> None:
        """Stops reducing parameters switched off with requires_grad_(False), as every rank does at the same step.
        Their zero gradients, sent this step so that no rank waited, are dropped again: the wrapped optimizer skips a
        parameter without a gradient, where a zero one would still move it by momentum or weight decay."""
        gone = {id(p) for p in frozen}
        mine = {id(handle) for handle in self._hvd_hooks}
        for p in frozen:
            p.grad = None
            del self._hvd_param_of[id(p)]
            self._hvd_passes_left.pop(id(p), None)
            hook = gradient_hooks.hooked.get(p)
            if hook is not None and id(hook) in mine:  # switched on again, it is taken in at that step
                hook.remove()
                del gradient_hooks.hooked[p]
        self._hvd_params = [p for p in self._hvd_params if id(p) not in gone]
        self._hvd_frozen += frozen
        if self._hvd_buckets is not None:
            self._hvd_buckets.stale = True

    def _hvd_take_unfrozen(self) -> None:
        if not any(p.requires_grad for p in self._hvd_frozen):
            return
        unfrozen = [p for p in self._hvd_frozen if p.requires_grad]
        option = self._hvd_state_per_parameter()
        if option is not None:
            raise NotImplementedError(
                f"parameter {self._parameter_names[unfrozen[0]]!r} became trainable after DistributedOptimizer "
                f"was created, which is not supported with {option}: create the optimizer after unfreezing"
            )
        self._hvd_frozen = [p for p in self._hvd_frozen if not p.requires_grad]
        self._hvd_take_in(unfrozen)

    def add_param_group(self, param_group) -> None:
        """torch's add_param_group (unfreezing layers part way through training, say); the group's parameters are
        averaged from the next step on, named by their position in param_groups, so every rank must add the same
        groups in the same order."""
        option = self._hvd_state_per_parameter()
        if option is not None:
            raise NotImplementedError(f"add_param_group() is not supported with {option}")
        if self._hvd_member and self._hvd_pending():
            raise AssertionError(
                "optimizer.add_param_group() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(): add parameter groups between steps"
            )
        before = sum(len(group["params"]) for group in self.param_groups)
        super().add_param_group(param_group)  # torch refuses a parameter that another group has
        added = self.param_groups[-1]["params"]
        taken = set(self._hvd_names.values())
        for position, p in enumerate(added, start=before):
            name = f"allreduce.param.{position}"
            if name in taken:
                self.param_groups.pop()  # as if never added
                raise ValueError(f"the added parameter at position {position} would be named {name!r}, a name in use")
            self._hvd_names[id(p)] = name
            self._parameter_names[p] = name[len("allreduce.") :]
        self._hvd_frozen += [p for p in added if not p.requires_grad]
        self._hvd_take_in([p for p in added if p.requires_grad])

    def zero_grad(self, set_to_none: bool = True):
        if self._hvd_member and self._hvd_pending():
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause "
                "a race condition."
            )
        self._hvd_reduced_for_scaler = False
        return super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step: int = 1,
    op=Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups=None,
    sparse_as_dense: bool = False,
    process_set=global_process_set,
    reduce_during_backward: Optional[bool] = None,
    sync_every: Optional[int] = None,
    sync_warmup_steps: int = 0,
    outer_lr: float = 1.0,
    outer_momentum: float = 0.0,
    average_optimizer_state: bool = False,
    staleness: Optional[int] = None,
    shard_optimizer_state: bool = False,
):
    """Returns optimizer, now averaging gradients over the ranks of process_set (Horovod's signature).

    The optimizer object is kept (its state and hyper-parameters stay); its class becomes a subclass of the
    original with the distributed step(), synchronize(), skip_synchronize(), set_backward_passes_per_step()
    and zero_grad() checks. gradient_predivide_factor (op=Average only) scales gradients by
    1/gradient_predivide_factor before the sum and gradient_predivide_factor/size after it. num_groups is
    Horovod's deprecated spelling of an integer groups. reduce_during_backward (hvdlite's own, default: the
    HVDLITE_REDUCE_DURING_BACKWARD knob, else automatic) chooses between reducing each gradient as backward
    produces it and reducing them all in synchronize(); see the module's docstring.

    sync_every=k (hvdlite's own) turns on local SGD (hvdlite.torch.local_sgd): after sync_warmup_steps
    synchronous steps, each rank steps on its own gradients and the parameters (with average_optimizer_state, also
    the optimizer's per-parameter tensors such as momentum) are averaged every k steps; outer_lr and
    outer_momentum apply the averaged change through an outer Nesterov SGD step.

    staleness=s (hvdlite's own, s >= 1; hvdlite.torch.staleness) starts each step's gradient allreduce without
    waiting and applies it s steps later, so communication overlaps the next s steps' compute; no rank gets more
    than s steps ahead of the slowest. The first s steps apply nothing; drain() applies the last s.

    shard_optimizer_state=True (hvdlite's own; ZeRO stage 1, hvdlite.torch.sharded_state) keeps on each rank the
    optimizer state of about 1/N of the parameters: a rank steps the parameters it owns and the updated parameters
    are allgathered. state_dict() needs consolidate_state_dict(to=rank) first and is then the unsharded one.
    """
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    grad_scaler.install()
    base = optimizer.__class__
    optimizer.__class__ = type(base.__name__, (_DistributedOptimizer, base), {})
    optimizer._hvd_setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
        reduce_during_backward,
        None
        if sync_every is None
        else dict(
            sync_every=sync_every,
            warmup_steps=sync_warmup_steps,
            outer_lr=outer_lr,
            outer_momentum=outer_momentum,
            average_optimizer_state=average_optimizer_state,
        ),
        staleness,
        shard_optimizer_state,
    )
    return optimizer
