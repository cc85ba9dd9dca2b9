#include "common/dtype.h"

namespace hvdlite {

bool dtype_valid(int32_t value) { return value >= 0 && value < kNumDTypes; }

const char* dtype_name(DType dtype) {
  static const char* const names[kNumDTypes] = {"uint8",   "int8",    "int32", "int64",  "float16", "bfloat16",
                                                "float32", "float64", "bool",  "uint16", "int16"};
  int i = static_cast<int>(dtype);
  return (i >= 0 && i < kNumDTypes) ? names[i] : "unknown";
}

bool dtype_is_floating(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {                                               // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    // The half subnormal is mantissa * 2^(exponent - 126) in units of 2^-24: drop (126 - exponent) bits.
    uint32_t dropped_bits = 126 - exponent;
    uint32_t value = mantissa >> dropped_bits;
    uint32_t remainder = mantissa & ((1u << dropped_bits) - 1);
    uint32_t halfway = 1u << (dropped_bits - 1);
    if (remainder > halfway || (remainder == halfway && (value & 1u))) ++value;
    return static_cast<uint16_t>(sign | value);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

}  // namespace hvdlite
