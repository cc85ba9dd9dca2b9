"""broadcast_optimizer_state gives every rank rank 0's Adam state (moments and step counts that exist only
there), broadcast_object rank 0's objects, lambdas included, and allgather_object every rank's."""

import torch
from training_common import N, R, hvd, make_model

model = make_model()
opt = torch.optim.Adam(model.parameters(), lr=0.01 * (R + 1))
if R == 0:  # rank 0 has taken steps: moment buffers and the step counter exist only there
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(2, 6)).sum().backward()
        opt.step()
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
state = opt.state_dict()
assert state["param_groups"][0]["lr"] == 0.01, state["param_groups"][0]["lr"]
steps = [float(s["step"]) for s in state["state"].values()]
assert steps and all(s == 3.0 for s in steps), steps
digest = torch.cat([s["exp_avg"].flatten() for s in state["state"].values()])
everyone = hvd.allgather(digest.unsqueeze(0), name="adam_state")
assert all(torch.equal(everyone[r], digest) for r in range(N))
obj = hvd.broadcast_object({"epoch": 7, "fn": (lambda v: v * 3)} if R == 0 else None, root_rank=0)
assert obj["epoch"] == 7 and obj["fn"](2) == 6
assert hvd.allgather_object({"rank": R}) == [{"rank": r} for r in range(N)]
