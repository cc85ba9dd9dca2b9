"""SyncBatchNorm: batch normalisation whose statistics cover the whole global batch.

Each rank computes the per-channel sum, sum of squares and count of its local batch; one differentiable
allreduce (Sum) makes them global; mean and variance follow with ordinary torch ops. Autograd then yields the
exact gradient of the global normalisation, because the backward of a sum-allreduce is a sum-allreduce of the
incoming gradients. Running statistics use the unbiased global variance, as torch.nn.BatchNorm does.
"""

import torch
import torch.nn.functional as F

from hvdlite.common.basics import global_process_set
from hvdlite.common.ops import Sum
from hvdlite.torch.autograd import AllreduceFunction


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    _instances = 0

    def __init__(
        self,
        num_features,
        eps=1e-5,
        momentum=0.1,
        affine=True,
        track_running_stats=True,
        process_set=global_process_set,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set
        # Models are built in the same order on every rank, so this index names the same layer everywhere.
        self._index = SyncBatchNorm._instances
        SyncBatchNorm._instances += 1

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {input.dim()}-D)")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        channels = input.shape[1]
        reduce_dims = [0] + list(range(2, input.dim()))
        count = torch.tensor([input.numel() / channels], dtype=input.dtype)
        local = torch.cat([input.sum(reduce_dims), (input * input).sum(reduce_dims), count])
        total = AllreduceFunction.apply(local, f"sync_batch_norm.{self._index}", Sum, 1.0, 1.0, self.process_set)
        n = total[2 * channels]
        mean = total[:channels] / n
        var = total[channels : 2 * channels] / n - mean * mean
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                unbiased = var * (n / max(n - 1, 1))
                self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.detach() * momentum)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + self.eps)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=global_process_set):
        """Returns module with every BatchNorm*d replaced by SyncBatchNorm (weights and statistics copied)."""
        converted = module
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, SyncBatchNorm):
            converted = cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
                process_set,
            )
            if module.affine:
                with torch.no_grad():
                    converted.weight.copy_(module.weight)
                    converted.bias.copy_(module.bias)
            if module.track_running_stats:
                converted.running_mean.copy_(module.running_mean)
                converted.running_var.copy_(module.running_var)
                converted.num_batches_tracked.copy_(module.num_batches_tracked)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return converted
