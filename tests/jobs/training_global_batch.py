"""Both ways of scheduling the reduction (as backward produces each gradient, or all in step()) give the
single-process result; auto on CI's 2 cores with one torch thread per rank defers."""

import os

import torch
import torch.nn.functional as F
from training_common import N, R, assert_same_everywhere, data, flat, hvd, make_model, shard

from hvdlite.torch.pending_gradients import DEFERRED

model, ref = make_model(), make_model()
torch.manual_seed(100 + R)  # different starting points: broadcast_parameters must fix them
with torch.no_grad():
    for p in model.parameters():
        p.add_(torch.randn_like(p))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), named_parameters=model.named_parameters()
)
hvd.broadcast_optimizer_state(opt, root_rank=0)
mode = os.environ["HVDLITE_REDUCE_DURING_BACKWARD"]
expected = {"1": True, "0": False}.get(mode, os.cpu_count() > N)
assert opt.reduces_during_backward == expected, (mode, opt.reduces_during_backward)
ref.load_state_dict(hvd.broadcast_object(model.state_dict() if R == 0 else None, 0))
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
for step in range(6):
    x, y = data(step)
    opt.zero_grad()
    F.cross_entropy(model(shard(x)), shard(y)).backward()
    submitted = [h is not DEFERRED for h in opt._hvd_handles.values()]
    assert len(submitted) == len(list(model.parameters()))
    assert all(submitted) == expected and any(submitted) == expected
    opt.step()
    ref_opt.zero_grad()
    F.cross_entropy(ref(x), y).backward()
    ref_opt.step()
assert_same_everywhere(model, "sgd")
assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()
