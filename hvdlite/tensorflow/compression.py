"""Gradient compression for allreduce (horovod.tensorflow.Compression): fp16/bf16 halve the bytes on the wire;
powersgd(...) and topk(...) build the Keras DistributedOptimizer's error-feedback exchange (error_feedback)."""

import tensorflow as tf

from hvdlite.common.compression import Compressor, NoneCompressor, make_compression  # noqa: F401
from hvdlite.tensorflow import error_feedback

Compression = make_compression(
    cast=tf.cast, is_floating=lambda d: d.is_floating, float16=tf.float16, bfloat16=tf.bfloat16
)
FP16Compressor, BF16Compressor = Compression.fp16, Compression.bf16
Compression.powersgd = staticmethod(error_feedback.powersgd)
Compression.topk = staticmethod(error_feedback.topk)
