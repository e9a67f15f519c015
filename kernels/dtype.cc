#include "kernels/dtype.h"

#include <cmath>

namespace tessera::kernels {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

std::optional<DType> DTypeFromName(absl::string_view name) {
  for (DType d : kAllDTypes) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromInt(int value) {
  if (value < 1 || value > 8) return std::nullopt;
  return static_cast<DType>(value);
}

bool IsFloating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF64;
}

uint16_t F32ToF16(float value) {
  uint32_t f = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (f >> 16) & 0x8000u;
  f &= 0x7fffffffu;
  if (f >= 0x47800000u) {  // |value| >= 65536, inf, NaN
    if (f > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // quiet NaN
    return static_cast<uint16_t>(sign | 0x7c00u);                       // infinity
  }
  if (f < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Adding 0.5 aligns the half's subnormal unit (2^-24) with the float's last mantissa
    // bit, so the FPU's own round-to-nearest-even does the rounding.
    constexpr uint32_t kMagic = (127 - 1) << 23;  // 0.5f
    float shifted = std::bit_cast<float>(f) + std::bit_cast<float>(kMagic);
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - kMagic));
  }
  // Normal: rebias the exponent (127 -> 15), then round the 13 dropped mantissa bits to
  // nearest even; a carry may bump the exponent, up to infinity at 65520.
  const uint32_t odd = (f >> 13) & 1u;
  f += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
  return static_cast<uint16_t>(sign | (f >> 13));
}

float F16ToF32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

namespace {

// The f32 nearest to `value` toward zero, with its last mantissa bit set when inexact: a
// later rounding to fewer bits then rounds as if from `value` itself.
float RoundToOddF32(double value) {
  float f = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(f) == value) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(value)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

}  // namespace

uint16_t F64ToF16(double value) { return F32ToF16(RoundToOddF32(value)); }
uint16_t F64ToBF16(double value) { return F32ToBF16(RoundToOddF32(value)); }

}  // namespace tessera::kernels
