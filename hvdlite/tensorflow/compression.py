"""Gradient compression for allreduce (horovod.tensorflow.Compression): fp16/bf16 halve the bytes on the wire."""

import tensorflow as tf

from hvdlite.common.compression import Compressor, NoneCompressor, make_compression  # noqa: F401

Compression = make_compression(
    cast=tf.cast, is_floating=lambda d: d.is_floating, float16=tf.float16, bfloat16=tf.bfloat16
)
FP16Compressor, BF16Compressor = Compression.fp16, Compression.bf16
