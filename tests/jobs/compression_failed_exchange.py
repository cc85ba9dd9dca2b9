"""PowerSGD builds gradient + residual in the residual's memory: when an exchange fails (here Q's, whose size
differs between the ranks), the error reaches every rank, the residual and the gradient are as before the step,
and the job goes on."""

import torch
from compression_common import N, PowerSGDReducer, R, fake_params, hvd

params, names = fake_params([(40, 30 + R)])
reducer = PowerSGDReducer(names, hvd.global_process_set, hvd.Average, hvd, rank=2, start_iter=0)
reducer.residuals["p0"] = torch.full((40, 30 + R), 0.5)
grad = torch.randint(-8, 8, (40, 30 + R), generator=torch.Generator().manual_seed(R)) / 4  # exact sums
params[0].grad = grad.clone()
try:
    reducer.reduce(params)
except Exception as e:  # noqa: BLE001
    assert "powersgd.Q" in str(e), e
else:
    raise AssertionError("an exchange of mismatched sizes went through")
assert torch.equal(reducer.residuals["p0"], torch.full((40, 30 + R), 0.5))
assert torch.equal(params[0].grad, grad)
assert hvd.allreduce(torch.ones(3), name="after", op=hvd.Sum).tolist() == [float(N)] * 3
