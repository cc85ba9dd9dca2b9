// Element-wise reductions and scaling for every dtype. Half types are widened to float per element; the
// loops are simple enough for the compiler to vectorise the native types.
//
// Scaling follows Horovod's CPU rule exactly (ScaleBuffer), so pre/postscale and integer Average give the
// same numbers as Horovod: integers are multiplied in double and truncated toward zero (C conversion);
// float16 and bfloat16 are widened to float32, multiplied by the factor rounded to float32, and rounded back
// to nearest-even; float32 uses the factor rounded to float32; float64 the factor as given.
#pragma once
#include <cstddef>

#include "common/dtype.h"

namespace hvdlite {

// Reductions the algorithms perform. Average is Sum followed by a postscale of 1/size (done by the executor).
// kBitwiseAnd serves the negotiation's bit vectors (integer types only).
enum class ReduceKind { kSum, kMin, kMax, kProduct, kBitwiseAnd };

// dst[i] = dst[i] (op) src[i]
void reduce_into(DType dtype, ReduceKind kind, void* dst, const void* src, size_t count);
// dst[i] = (dst[i] (op) src[i]) * factor: the two operations above, bit for bit, in one pass over the data
void reduce_into_scaled(DType dtype, ReduceKind kind, void* dst, const void* src, size_t count, double factor);
// data[i] *= factor (integers: truncated toward zero; bool: unchanged)
void scale_in_place(DType dtype, void* data, size_t count, double factor);
// dst[i] = src[i] * factor, in one pass (used when copying into and out of the fusion buffer)
void copy_scaled(DType dtype, void* dst, const void* src, size_t count, double factor);

}  // namespace hvdlite
