"""Gradient compression shared by the framework adapters (Horovod's Compression.none/fp16, plus bf16).

A compressor casts floating-point tensors to a narrower wire type before the allreduce and back afterwards;
each adapter supplies the framework's cast and dtype objects through make_compression().
"""


class Compressor:
    @staticmethod
    def compress(tensor, ctx=None):
        """Returns (tensor to send, context needed to decompress). `ctx` is accepted as in Horovod's
        TensorFlow compressors (an optional state; the built-in ones do not use it)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor, ctx=None):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def make_compression(cast, is_floating, float16, bfloat16):
    """Builds a Compression namespace for one framework: cast(tensor, dtype), is_floating(dtype)."""

    def cast_compressor(name, wire_dtype):
        def compress(tensor, ctx=None):
            if is_floating(tensor.dtype) and tensor.dtype != wire_dtype:
                return cast(tensor, wire_dtype), tensor.dtype
            return tensor, None

        def decompress(tensor, ctx):
            return tensor if ctx is None else cast(tensor, ctx)

        return type(name, (Compressor,), {"compress": staticmethod(compress), "decompress": staticmethod(decompress)})

    return type(
        "Compression",
        (),
        {
            "none": NoneCompressor,
            "fp16": cast_compressor("FP16Compressor", float16),
            "bf16": cast_compressor("BF16Compressor", bfloat16),
        },
    )
