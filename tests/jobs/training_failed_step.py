"""A step whose reductions fail (here: hvdlite shut down between backward and step; in elastic training, a
lost peer) raises, and ends the step: after init() again, zero_grad(), backward() and step() work and give the
averaged result. Reducing after backward submits in step(), so a submission that fails must not leave the
optimizer believing gradients are still in flight."""

import os
import time

import torch
import torch.nn.functional as F
from training_common import R, assert_same_everywhere, data, flat, hvd, make_model, shard, step_both

model, ref = make_model(), make_model()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
assert opt.reduces_during_backward == (os.environ["HVDLITE_REDUCE_DURING_BACKWARD"] == "1")
x, y = data(0)
if R == 1:
    # Rank 0 must shut down while its reductions wait for this rank: a tiny model's reductions during backward
    # could otherwise all finish before the shutdown, and the step would rightly succeed (a race that failed about
    # 1 run in 7). This rank then submits to a runtime that has stopped.
    time.sleep(0.5)
F.cross_entropy(model(shard(x)), shard(y)).backward()
hvd.shutdown()
try:
    opt.step()
except Exception as e:
    print("failed as expected:", type(e).__name__, e)
else:
    raise SystemExit("a step without hvdlite succeeded")
hvd.init()
model.load_state_dict(ref.state_dict())  # the failed step may have applied this rank's own gradients
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
step_both(model, opt, ref, ref_opt, 0)
assert_same_everywhere(model, "after-failure")
assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()
