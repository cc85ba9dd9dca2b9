#include "collectives/reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/copy_bytes.h"

namespace hvdlite {
namespace {

template <typename T>
void bitwise_and(T* __restrict__ dst, const T* __restrict__ src, size_t n) {
  if constexpr (std::is_integral<T>::value) {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(dst[i] & src[i]);
  }
}

// Integer sums and products wrap, as the hardware's do, but computed in an unsigned type at least as wide as
// unsigned int: a signed overflow (int32 sums, or int16 and uint16 products after promotion to int) is undefined
// behaviour in C++, and UBSan found it. The same instructions come out for the common cases.
template <typename T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <typename T>
T add(T a, T b) {
  if constexpr (std::is_integral<T>::value) {
    return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
  } else {
    return static_cast<T>(a + b);
  }
}

template <typename T>
T multiply(T a, T b) {
  if constexpr (std::is_integral<T>::value) {
    return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
  } else {
    return static_cast<T>(a * b);
  }
}

template <typename T>
void reduce_native(ReduceKind kind, T* __restrict__ dst, const T* __restrict__ src, size_t n) {
  switch (kind) {
    case ReduceKind::kSum:
      for (size_t i = 0; i < n; ++i) dst[i] = add(dst[i], src[i]);
      break;
    case ReduceKind::kMin:
      for (size_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);
      break;
    case ReduceKind::kMax:
      for (size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
      break;
    case ReduceKind::kProduct:
      for (size_t i = 0; i < n; ++i) dst[i] = multiply(dst[i], src[i]);
      break;
    case ReduceKind::kBitwiseAnd:
      bitwise_and(dst, src, n);
      break;
  }
}

void reduce_bool(ReduceKind kind, uint8_t* __restrict__ dst, const uint8_t* __restrict__ src, size_t n) {
  // Sum and max are logical or; product and min are logical and.
  if (kind == ReduceKind::kSum || kind == ReduceKind::kMax) {
    for (size_t i = 0; i < n; ++i) dst[i] = (dst[i] | src[i]) ? 1 : 0;
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = (dst[i] && src[i]) ? 1 : 0;
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_half(ReduceKind kind, uint16_t* __restrict__ dst, const uint16_t* __restrict__ src, size_t n) {
  constexpr size_t kBlock = 256;
  float a[kBlock], b[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    size_t m = std::min(kBlock, n - start);
    for (size_t i = 0; i < m; ++i) {
      a[i] = ToFloat(dst[start + i]);
      b[i] = ToFloat(src[start + i]);
    }
    reduce_native<float>(kind, a, b, m);
    for (size_t i = 0; i < m; ++i) dst[start + i] = FromFloat(a[i]);
  }
}

// An integer times a factor, as Horovod computes it: the product in double, truncated toward zero. Products
// outside int64 (or NaN) become INT64_MIN, what x86's conversion gives; narrower types then wrap like integer
// arithmetic, so no input is undefined behaviour.
template <typename T>
T scale_integer(T v, double factor) {
  const double product = factor * static_cast<double>(v);
  constexpr double kTwo63 = 9223372036854775808.0;
  const int64_t truncated =
      (product > -kTwo63 && product < kTwo63) ? static_cast<int64_t>(product) : std::numeric_limits<int64_t>::min();
  return static_cast<T>(truncated);
}

template <typename T>
void copy_scaled_native(T* __restrict__ dst, const T* __restrict__ src, size_t n, double factor) {
  if (std::is_floating_point<T>::value) {
    const T f = static_cast<T>(factor);
    for (size_t i = 0; i < n; ++i) dst[i] = src[i] * f;
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = scale_integer<T>(src[i], factor);
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void copy_scaled_half(uint16_t* dst, const uint16_t* src, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < n; ++i) dst[i] = FromFloat(ToFloat(src[i]) * f);
}

}  // namespace

void reduce_into(DType dtype, ReduceKind kind, void* dst, const void* src, size_t count) {
  switch (dtype) {
    case DType::kUInt8:
      reduce_native(kind, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count);
      break;
    case DType::kInt8:
      reduce_native(kind, static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), count);
      break;
    case DType::kUInt16:
      reduce_native(kind, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count);
      break;
    case DType::kInt16:
      reduce_native(kind, static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), count);
      break;
    case DType::kInt32:
      reduce_native(kind, static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count);
      break;
    case DType::kInt64:
      reduce_native(kind, static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count);
      break;
    case DType::kFloat32:
      reduce_native(kind, static_cast<float*>(dst), static_cast<const float*>(src), count);
      break;
    case DType::kFloat64:
      reduce_native(kind, static_cast<double*>(dst), static_cast<const double*>(src), count);
      break;
    case DType::kBool:
      reduce_bool(kind, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count);
      break;
    case DType::kFloat16:
      reduce_half<half_to_float, float_to_half>(kind, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                                                count);
      break;
    case DType::kBFloat16:
      reduce_half<bf16_to_float, float_to_bf16>(kind, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                                                count);
      break;
  }
}

void copy_scaled(DType dtype, void* dst, const void* src, size_t count, double factor) {
  if (count == 0) return;  // empty tensors may have null buffers
  if (factor == 1.0 || dtype == DType::kBool) {
    const size_t bytes = count * dtype_size(dtype);
    const char* d = static_cast<const char*>(dst);
    const char* s = static_cast<const char*>(src);
    if (d + bytes <= s || s + bytes <= d)
      copy_bytes(dst, src, bytes);  // disjoint (fusion copies)
    else if (dst != src)
      std::memmove(dst, src, bytes);
    return;
  }
  switch (dtype) {
    case DType::kUInt8:
      copy_scaled_native(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, factor);
      break;
    case DType::kInt8:
      copy_scaled_native(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), count, factor);
      break;
    case DType::kUInt16:
      copy_scaled_native(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count, factor);
      break;
    case DType::kInt16:
      copy_scaled_native(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), count, factor);
      break;
    case DType::kInt32:
      copy_scaled_native(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count, factor);
      break;
    case DType::kInt64:
      copy_scaled_native(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, factor);
      break;
    case DType::kFloat32:
      copy_scaled_native(static_cast<float*>(dst), static_cast<const float*>(src), count, factor);
      break;
    case DType::kFloat64:
      copy_scaled_native(static_cast<double*>(dst), static_cast<const double*>(src), count, factor);
      break;
    case DType::kFloat16:
      copy_scaled_half<half_to_float, float_to_half>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                                                     count, factor);
      break;
    case DType::kBFloat16:
      copy_scaled_half<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                                                     count, factor);
      break;
    case DType::kBool:
      break;
  }
}

void scale_in_place(DType dtype, void* data, size_t count, double factor) {
  copy_scaled(dtype, data, data, count, factor);
}

void reduce_into_scaled(DType dtype, ReduceKind kind, void* dst, const void* src, size_t count, double factor) {
  if (factor == 1.0) {
    reduce_into(dtype, kind, dst, src, count);
    return;
  }
  // The same two passes as reduce_into + scale_in_place, so the results are bit-identical, but a block at a time:
  // the scaling pass then reads and writes L1 instead of a second trip through L2 or memory.
  constexpr size_t kBlockBytes = 4096;
  const size_t esize = dtype_size(dtype);
  const size_t block = kBlockBytes / esize;
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (size_t done = 0; done < count; done += block) {
    const size_t n = std::min(block, count - done);
    reduce_into(dtype, kind, d + done * esize, s + done * esize, n);
    scale_in_place(dtype, d + done * esize, n, factor);
  }
}

}  // namespace hvdlite
