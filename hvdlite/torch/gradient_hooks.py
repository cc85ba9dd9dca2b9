"""How a DistributedOptimizer hears that a parameter's gradient is final: a post-accumulate-grad hook on each
parameter, which autograd calls once per parameter per backward pass.

The hook is the optimizer's _hvd_on_grad, reached through a weak reference. Where hvdlite._fast_calls was built, a
hook in C (gradient_calls.c's note_gradient) stands in front of it and takes the common cases itself: noting a
gradient for step(), or counting it into its gradient bucket and queueing the bucket after its last one. It follows
the optimizer's route list ([mode, bucket by parameter id, gradients each bucket awaits, on_bucket_full]) and hands
everything else, the first gradient of each pass included, to the Python hook.
"""

import weakref

from torch.utils.weak import WeakIdKeyDictionary

from hvdlite.common import ops
from hvdlite.torch.pending_gradients import BATCHED, DEFERRED

# Each parameter's gradient hook, by parameter: the newest DistributedOptimizer over a parameter reduces it.
hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()


def gradient_hook(optimizer):
    """The hook that tells optimizer a parameter's gradient is final. It holds the optimizer weakly: a parameter
    keeps its hooks in autograd's C++ state, out of the garbage collector's sight, so a hook holding the optimizer
    would keep a discarded optimizer, its model and its buffers alive for good, still reducing on every backward."""
    owner = weakref.ref(optimizer)

    def on_gradient(p):
        live = owner()
        if live is not None:
            live._hvd_on_grad(p)

    def on_bucket_full(index, p):
        live = owner()
        if live is not None:
            live._hvd_bucket_full(index, p)

    if ops.fast_calls is None:
        return on_gradient
    # A Python hook's frames cost as much as autograd's own call of it, and more.
    route = optimizer._hvd_hook_route
    route[3] = on_bucket_full
    return ops.fast_calls.gradient_note(optimizer._hvd_handles, DEFERRED, BATCHED, route, on_gradient)


def hook_parameters(params, hook) -> list:
    """Registers hook on each parameter, removing the hook an earlier DistributedOptimizer left there: two
    optimizers reducing one parameter would both submit its gradient under its name every backward."""
    handles = []
    for p in params:
        earlier = hooked.get(p)
        if earlier is not None:
            earlier.remove()
        handle = hooked[p] = p.register_post_accumulate_grad_hook(hook)
        handles.append(handle)
    return handles


def remove_hooks(handles) -> None:
    for handle in handles:
        handle.remove()
