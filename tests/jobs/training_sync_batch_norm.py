"""SyncBatchNorm on each rank's shard matches BatchNorm on the full batch: outputs, running statistics and
gradients."""

import torch
import torch.nn as nn
from training_common import N, R, hvd

torch.manual_seed(5)
x = torch.randn(N * 3, 4, 5, 5)
bn = nn.BatchNorm2d(4)
sync = hvd.SyncBatchNorm(4)
with torch.no_grad():
    bn.weight.uniform_(0.5, 1.5)
    bn.bias.uniform_(-0.5, 0.5)
    sync.weight.copy_(bn.weight)
    sync.bias.copy_(bn.bias)
xg = x.clone().requires_grad_(True)
weights = torch.arange(x.numel(), dtype=torch.float32).reshape(x.shape) / x.numel()
reference = bn(xg)  # one forward: it also updates bn's running statistics once
(reference * weights).sum().backward()
xl = x[R * 3 : (R + 1) * 3].clone().requires_grad_(True)
out = sync(xl)
assert torch.allclose(out, reference.detach()[R * 3 : (R + 1) * 3], atol=1e-5)
(out * weights[R * 3 : (R + 1) * 3]).sum().backward()
assert torch.allclose(xl.grad, xg.grad[R * 3 : (R + 1) * 3], atol=1e-5), (
    (xl.grad - xg.grad[R * 3 : (R + 1) * 3]).abs().max()
)
assert torch.allclose(sync.running_mean, bn.running_mean, atol=1e-6)
assert torch.allclose(sync.running_var, bn.running_var, atol=1e-5)
grads = hvd.allreduce(sync.weight.grad, op=hvd.Sum, name="bn.wgrad")
assert torch.allclose(grads, bn.weight.grad, atol=1e-4)
converted = hvd.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)))
assert isinstance(converted[1], hvd.SyncBatchNorm)
