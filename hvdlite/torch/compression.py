"""Gradient compression for allreduce (horovod.torch.Compression): fp16/bf16 halve the bytes on the wire;
powersgd(...) and topk(...) build DistributedOptimizer's error-feedback reducers (gradient_reducers)."""

import torch

from hvdlite.common.compression import Compressor, NoneCompressor, make_compression  # noqa: F401
from hvdlite.torch import gradient_reducers

Compression = make_compression(
    cast=lambda t, dtype: t.to(dtype),
    is_floating=lambda d: d.is_floating_point,
    float16=torch.float16,
    bfloat16=torch.bfloat16,
)
FP16Compressor, BF16Compressor = Compression.fp16, Compression.bf16
Compression.powersgd = staticmethod(gradient_reducers.powersgd)
Compression.topk = staticmethod(gradient_reducers.topk)
