// Element types, their sizes and names, and the half-precision conversions the reductions need.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hvdlite {

enum class DType : int32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kBool = 8,
  kUInt16 = 9,
  kInt16 = 10,  // values are the C ABI's hvdlite_dtype
};
constexpr int kNumDTypes = 11;

bool dtype_valid(int32_t value);
// Inline: every operation asks it several times (validation, the eager check, fusion, the recent operations).
inline size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kUInt16:
    case DType::kInt16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}
const char* dtype_name(DType dtype);
bool dtype_is_floating(DType dtype);

// IEEE binary16 and bfloat16 <-> float. Round-to-nearest-even on the way down, like the frameworks.
inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

}  // namespace hvdlite
