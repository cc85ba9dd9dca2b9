"""DistributedOptimizer's usage errors name what is wrong: names that are not unique, a parameter that
named_parameters does not name, zero_grad between backward and step, an invalid HVDLITE_REDUCE_DURING_BACKWARD."""

import os

import torch
from training_common import hvd, make_model

model = make_model()
try:
    hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=[("w", p) for p in model.parameters()]
    )
except ValueError as e:
    assert "unique" in str(e) and "w" in str(e)
else:
    raise SystemExit("duplicate names accepted")
model = make_model()
try:
    hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=list(model.named_parameters())[:2]
    )
except ValueError as e:
    assert "does not name" in str(e)
else:
    raise SystemExit("missing names accepted")
model = make_model()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
model(torch.randn(2, 6)).sum().backward()
try:
    opt.zero_grad()
except AssertionError as e:
    assert "zero_grad" in str(e)
else:
    raise SystemExit("zero_grad between backward and step accepted")
opt.step()
opt.zero_grad()
os.environ["HVDLITE_REDUCE_DURING_BACKWARD"] = "maybe"
try:
    hvd.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1))
except ValueError as e:
    assert "HVDLITE_REDUCE_DURING_BACKWARD='maybe'" in str(e), e
else:
    raise SystemExit("a malformed HVDLITE_REDUCE_DURING_BACKWARD was accepted")
os.environ["HVDLITE_REDUCE_DURING_BACKWARD"] = "0"  # the argument wins over the variable
assert (
    hvd.DistributedOptimizer(
        torch.optim.SGD(make_model().parameters(), lr=0.1), reduce_during_backward=True
    ).reduces_during_backward
    is True
)
