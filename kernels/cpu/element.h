#ifndef TESSERA_KERNELS_CPU_ELEMENT_H_
#define TESSERA_KERNELS_CPU_ELEMENT_H_

// Storage and compute types per dtype, and dtype dispatch, shared by the CPU kernels.
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/dtype.h"

namespace tessera::kernels::cpu {

template <DType D>
struct Elem;
// A dtype stored and computed as the same C++ type.
template <typename T>
struct PlainElem {
  using Storage = T;
  using Compute = T;
  static Compute Load(Storage s) { return s; }
  static Storage Store(Compute c) { return c; }
};
template <>
struct Elem<DType::kF32> : PlainElem<float> {};
template <>
struct Elem<DType::kF64> : PlainElem<double> {};
template <>
struct Elem<DType::kF16> {
  using Storage = uint16_t;
  using Compute = float;  // f16 is computed in f32 and rounded once
  static Compute Load(Storage s) { return F16ToF32(s); }
  static Storage Store(Compute c) { return F32ToF16(c); }
};
template <>
struct Elem<DType::kBF16> {
  using Storage = uint16_t;
  using Compute = float;
  static Compute Load(Storage s) { return BF16ToF32(s); }
  static Storage Store(Compute c) { return F32ToBF16(c); }
};
template <>
struct Elem<DType::kI32> : PlainElem<int32_t> {};
template <>
struct Elem<DType::kI64> : PlainElem<int64_t> {};
template <>
struct Elem<DType::kU8> : PlainElem<uint8_t> {};
template <>
struct Elem<DType::kBool> {
  using Storage = uint8_t;
  using Compute = uint8_t;
  static Compute Load(Storage s) { return s != 0; }
  static Storage Store(Compute c) { return c != 0; }
};

template <DType D>
inline constexpr bool kIsFloat =
    D == DType::kF32 || D == DType::kF64 || D == DType::kF16 || D == DType::kBF16;

/// Calls `f.template operator()<D>()` for the runtime dtype.
template <typename F>
decltype(auto) Dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f.template operator()<DType::kF32>();
    case DType::kF16:
      return f.template operator()<DType::kF16>();
    case DType::kBF16:
      return f.template operator()<DType::kBF16>();
    case DType::kF64:
      return f.template operator()<DType::kF64>();
    case DType::kI32:
      return f.template operator()<DType::kI32>();
    case DType::kI64:
      return f.template operator()<DType::kI64>();
    case DType::kU8:
      return f.template operator()<DType::kU8>();
    case DType::kBool:
      break;
  }
  return f.template operator()<DType::kBool>();
}

/// Grain for element-wise work (elements): large enough to amortize scheduling (a 64 MiB f32
/// add is 128 chunks), small enough to spread 1 MiB tensors over the workers.
inline constexpr int64_t kElementGrain = 1 << 17;

}  // namespace tessera::kernels::cpu

#endif  // TESSERA_KERNELS_CPU_ELEMENT_H_
