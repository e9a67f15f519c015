#ifndef TESSERA_KERNELS_DTYPE_H_
#define TESSERA_KERNELS_DTYPE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace tessera::kernels {

/// Element types. The numeric values equal tessera.v1.DType's.
enum class DType : uint8_t {
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF64 = 4,
  kI32 = 5,
  kI64 = 6,
  kU8 = 7,
  kBool = 8,  // one byte, 0 or 1
};

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                                       DType::kI32, DType::kI64, DType::kU8,   DType::kBool};

/// Bytes per element.
size_t DTypeSize(DType dtype);
/// "f32", "f16", "bf16", "f64", "i32", "i64", "u8", "bool".
absl::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromName(absl::string_view name);
/// A valid DType for a wire value, or nullopt.
std::optional<DType> DTypeFromInt(int value);
bool IsFloating(DType dtype);

// IEEE 754 binary16 and bfloat16, converted with round-to-nearest-even; NaN stays NaN,
// overflow becomes infinity, underflow becomes subnormal or signed zero.
uint16_t F32ToF16(float value);
float F16ToF32(uint16_t bits);

inline uint16_t F32ToBF16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
inline float BF16ToF32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

/// f64 to f16/bf16 rounded once (via a round-to-odd f32, which avoids double rounding).
uint16_t F64ToF16(double value);
uint16_t F64ToBF16(double value);

}  // namespace tessera::kernels

#endif  // TESSERA_KERNELS_DTYPE_H_
