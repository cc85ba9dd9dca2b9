"""Mixed precision with torch.amp.GradScaler and a DistributedOptimizer, in the plain pattern:

    scaler.scale(loss).backward()
    scaler.step(optimizer)        # or scaler.unscale_(optimizer); clip; scaler.step(optimizer)
    scaler.update()

GradScaler decides whether to skip a step from the gradients it unscales (found_inf). Read before the allreduce,
those are each rank's own: a rank whose loss overflowed skips optimizer.step() and with it the step's collective,
while the others wait in it. So GradScaler.unscale_ (which its step() calls) first waits for a DistributedOptimizer's
reductions: every rank then unscales the same averaged gradients (an inf or NaN on one rank reaches all of them
through the sum), agrees on found_inf, and skips or steps together; clipping after unscale_ sees the global
gradient, as in one process. step() does not reduce a second time. Horovod's pattern (synchronize(), unscale_,
clip, step() inside skip_synchronize()) works unchanged: its synchronize() has already reduced.

Installed on torch.amp.GradScaler (the base of torch.cuda.amp.GradScaler) when the first DistributedOptimizer is
made; an optimizer that is not a DistributedOptimizer is unscaled exactly as before.
"""

import torch

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    original = torch.amp.GradScaler.unscale_

    def unscale_(self, optimizer):
        reduce_first = getattr(optimizer, "_hvd_reduce_before_unscale", None)
        if reduce_first is not None and self.is_enabled():
            reduce_first()
        return original(self, optimizer)

    unscale_.__doc__ = original.__doc__
    unscale_.__wrapped__ = original
    torch.amp.GradScaler.unscale_ = unscale_
    _installed = True
