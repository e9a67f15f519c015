// Unary, broadcasting binary, cast, fill, transpose and the test-only faulting kernel.
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace tessera_cuda {
namespace {

template <typename C>
__device__ __forceinline__ C FloatUnary(int op, C x, C alpha, C beta) {
  constexpr bool kDouble = std::is_same_v<C, double>;
  switch (op) {
    case kNeg:
      return -x;
    case kAbs:
      return kDouble ? fabs(x) : fabsf(x);
    case kRelu:
      return x < C(0) ? C(0) : x;  // NaN stays NaN
    case kExp:
      return kDouble ? exp(x) : expf(x);
    case kLog:
      return kDouble ? log(x) : logf(x);
    case kSqrt:
      return kDouble ? sqrt(x) : sqrtf(x);
    case kRsqrt:
      return C(1) / (kDouble ? sqrt(x) : sqrtf(x));
    case kGelu:
      return C(0.5) * x *
             (C(1) +
              (kDouble ? erf(x * C(0.70710678118654752440)) : erff(x * C(0.70710678118654752440))));
    case kSigmoid:
      return C(1) / (C(1) + (kDouble ? exp(-x) : expf(-x)));
    case kTanh:
      return kDouble ? tanh(x) : tanhf(x);
    case kScale:
      return alpha * x + beta;
  }
  return x;
}

template <typename T>
__device__ __forceinline__ T IntUnary(int op, T x) {
  using U = std::make_unsigned_t<T>;
  const T negated = static_cast<T>(U{0} - static_cast<U>(x));  // wraps like the CPU backend
  switch (op) {
    case kNeg:
      return negated;
    case kAbs:
      return x < 0 ? negated : x;
    case kRelu:
      return x < 0 ? T(0) : x;
  }
  return x;
}

template <typename C>
__device__ __forceinline__ C FloatBinary(int op, C a, C b) {
  constexpr bool kDouble = std::is_same_v<C, double>;
  switch (op) {
    case kAdd:
      return a + b;
    case kSub:
      return a - b;
    case kMul:
      return a * b;
    case kDiv:
      return a / b;
    case kMaximum:
      return (IsNan(a) || a > b) ? a : b;  // NaN wins
    case kMinimum:
      return (IsNan(a) || a < b) ? a : b;
    case kPow:
      return kDouble ? pow(a, b) : powf(a, b);
  }
  return a;
}

template <typename T>
__device__ __forceinline__ T IntBinary(int op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
  switch (op) {
    case kAdd:
      return static_cast<T>(static_cast<Wide>(a) + static_cast<Wide>(b));
    case kSub:
      return static_cast<T>(static_cast<Wide>(a) - static_cast<Wide>(b));
    case kMul:
      return static_cast<T>(static_cast<Wide>(a) * static_cast<Wide>(b));
    case kDiv:
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<T>) {
        if (b == -1) return static_cast<T>(U{0} - static_cast<U>(a));  // MIN / -1 would trap
      }
      return static_cast<T>(a / b);
    case kMaximum:
      return a > b ? a : b;
    case kMinimum:
      return a < b ? a : b;
  }
  return a;
}

template <typename S>
__device__ __forceinline__ S ApplyUnary(int op, S x, double alpha, double beta) {
  using C = typename Elem<S>::C;
  if constexpr (std::is_floating_point_v<C>) {
    return Elem<S>::Store(
        FloatUnary<C>(op, Elem<S>::Load(x), static_cast<C>(alpha), static_cast<C>(beta)));
  } else {
    return IntUnary<S>(op, x);
  }
}

template <typename S>
__device__ __forceinline__ S ApplyBinary(int op, S a, S b) {
  using C = typename Elem<S>::C;
  if constexpr (std::is_floating_point_v<C>) {
    return Elem<S>::Store(FloatBinary<C>(op, Elem<S>::Load(a), Elem<S>::Load(b)));
  } else {
    return IntBinary<S>(op, a, b);
  }
}

// 16-byte packs: one vector load and store per pack (buffers are whole device
// allocations, so 256-byte aligned).
template <typename S>
struct alignas(16) Pack {
  static constexpr int kLanes = 16 / sizeof(S);
  S v[kLanes];
};

// Packs each thread loads before it computes and stores any of them: a unary kernel has one
// load in flight per pack where add has two, and would otherwise keep half as many bytes in
// flight per thread (issue 31: `scale` moved fewer bytes per second than `add`). Within each
// of the kUnroll rounds consecutive threads still read consecutive packs.
constexpr int kUnroll = 4;

// Packs [0, packs) in a grid-stride loop, kUnroll per thread at a time: `load(q, in)` for
// each of them first, then `store(q, in)` (compute and write) for each.
template <typename In, typename Load, typename Store>
__device__ __forceinline__ void ForEachPack(int64_t packs, Load load, Store store) {
  const int64_t stride = GlobalStride();
  int64_t q = GlobalThread();
  for (; q + (kUnroll - 1) * stride < packs; q += kUnroll * stride) {
    In in[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load(q + u * stride, in[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) store(q + u * stride, in[u]);
  }
  for (; q < packs; q += stride) {
    In in;
    load(q, in);
    store(q, in);
  }
}

template <typename S>
__device__ void Unary(int op, int64_t n, const S* __restrict__ x, S* __restrict__ y, double alpha,
                      double beta) {
  using P = Pack<S>;
  const int64_t packs = n / P::kLanes;
  const P* xp = reinterpret_cast<const P*>(x);
  P* yp = reinterpret_cast<P*>(y);
  ForEachPack<P>(
      packs, [&](int64_t q, P& in) { in = xp[q]; },
      [&](int64_t q, const P& in) {
        P out;
#pragma unroll
        for (int j = 0; j < P::kLanes; ++j) out.v[j] = ApplyUnary<S>(op, in.v[j], alpha, beta);
        yp[q] = out;
      });
  for (int64_t i = packs * P::kLanes + GlobalThread(); i < n; i += GlobalStride()) {
    y[i] = ApplyUnary<S>(op, x[i], alpha, beta);
  }
}

template <typename S>
struct PackPair {
  Pack<S> a, b;
};

template <typename S>
__device__ void Binary(int op, const BinaryParams& p, const S* __restrict__ a,
                       const S* __restrict__ b, S* __restrict__ y) {
  if (p.contiguous) {
    using P = Pack<S>;
    const int64_t packs = p.n / P::kLanes;
    const P* ap = reinterpret_cast<const P*>(a);
    const P* bp = reinterpret_cast<const P*>(b);
    P* yp = reinterpret_cast<P*>(y);
    ForEachPack<PackPair<S>>(
        packs,
        [&](int64_t q, PackPair<S>& in) {
          in.a = ap[q];
          in.b = bp[q];
        },
        [&](int64_t q, const PackPair<S>& in) {
          P out;
#pragma unroll
          for (int j = 0; j < P::kLanes; ++j) out.v[j] = ApplyBinary<S>(op, in.a.v[j], in.b.v[j]);
          yp[q] = out;
        });
    for (int64_t i = packs * P::kLanes + GlobalThread(); i < p.n; i += GlobalStride()) {
      y[i] = ApplyBinary<S>(op, a[i], b[i]);
    }
    return;
  }
  for (int64_t i = GlobalThread(); i < p.n; i += GlobalStride()) {
    const S va = a[Offset(i, p.rank, p.shape, p.stride_a)];
    const S vb = b[Offset(i, p.rank, p.shape, p.stride_b)];
    y[i] = ApplyBinary<S>(op, va, vb);
  }
}

// ---- conversions (cast and fill), with the CPU backend's rules ----------------------------

// DType codes (kernels/dtype.h).
enum Code : int { kF32 = 1, kF16, kBF16, kF64, kI32, kI64, kU8, kBool };

struct Value {
  bool is_float;
  double f;
  int64_t i;
};

__device__ __forceinline__ Value LoadAny(const void* x, int dtype, int64_t k) {
  switch (dtype) {
    case kF32:
      return {true, static_cast<const float*>(x)[k], 0};
    case kF16:
      return {true, __half2float(static_cast<const __half*>(x)[k]), 0};
    case kBF16:
      return {true, __bfloat162float(static_cast<const __nv_bfloat16*>(x)[k]), 0};
    case kF64:
      return {true, static_cast<const double*>(x)[k], 0};
    case kI32:
      return {false, 0, static_cast<const int32_t*>(x)[k]};
    case kI64:
      return {false, 0, static_cast<const int64_t*>(x)[k]};
    default:  // u8, bool
      return {false, 0, static_cast<const uint8_t*>(x)[k]};
  }
}

// Truncates toward zero and saturates at the limits (returned exactly, never converted
// from a double that may lie just outside the type); NaN becomes 0.
template <typename T>
__device__ __forceinline__ T SaturateFromDouble(double v, T lo, T hi) {
  if (IsNan(v)) return 0;
  v = trunc(v);
  if (v <= static_cast<double>(lo)) return lo;
  if (v >= static_cast<double>(hi)) return hi;
  return static_cast<T>(v);
}

template <typename T>
__device__ __forceinline__ T SaturateFromInt(int64_t v, int64_t lo, int64_t hi) {
  return static_cast<T>(v < lo ? lo : v > hi ? hi : v);
}

__device__ __forceinline__ void StoreAny(void* y, int dtype, int64_t k, const Value& v,
                                         bool source_f64) {
  if (dtype == kBool) {
    static_cast<uint8_t*>(y)[k] = (v.is_float ? v.f != 0 : v.i != 0) ? 1 : 0;
    return;
  }
  if (v.is_float) {
    switch (dtype) {
      case kF32:
        static_cast<float*>(y)[k] = static_cast<float>(v.f);
        return;
      case kF16:  // from f64: rounded once; from narrower floats the value is exact in f32
        static_cast<__half*>(y)[k] =
            source_f64 ? __double2half(v.f) : __float2half_rn(static_cast<float>(v.f));
        return;
      case kBF16:
        static_cast<__nv_bfloat16*>(y)[k] =
            source_f64 ? __double2bfloat16(v.f) : __float2bfloat16_rn(static_cast<float>(v.f));
        return;
      case kF64:
        static_cast<double*>(y)[k] = v.f;
        return;
      case kI32:
        static_cast<int32_t*>(y)[k] = SaturateFromDouble<int32_t>(v.f, INT32_MIN, INT32_MAX);
        return;
      case kI64:
        static_cast<int64_t*>(y)[k] = SaturateFromDouble<int64_t>(v.f, INT64_MIN, INT64_MAX);
        return;
      default:
        static_cast<uint8_t*>(y)[k] = SaturateFromDouble<uint8_t>(v.f, 0, 255);
        return;
    }
  }
  switch (dtype) {
    case kF32:
      static_cast<float*>(y)[k] = static_cast<float>(v.i);
      return;
    case kF16:
      static_cast<__half*>(y)[k] = __double2half(static_cast<double>(v.i));
      return;
    case kBF16:
      static_cast<__nv_bfloat16*>(y)[k] = __double2bfloat16(static_cast<double>(v.i));
      return;
    case kF64:
      static_cast<double*>(y)[k] = static_cast<double>(v.i);
      return;
    case kI32:
      static_cast<int32_t*>(y)[k] = SaturateFromInt<int32_t>(v.i, INT32_MIN, INT32_MAX);
      return;
    case kI64:
      static_cast<int64_t*>(y)[k] = v.i;
      return;
    default:
      static_cast<uint8_t*>(y)[k] = SaturateFromInt<uint8_t>(v.i, 0, 255);
      return;
  }
}

template <typename T>
__device__ void Permute(const PermuteParams& p, const T* __restrict__ x, T* __restrict__ y) {
  for (int64_t i = GlobalThread(); i < p.n; i += GlobalStride()) {
    y[i] = x[Offset(i, p.rank, p.out_shape, p.in_strides)];
  }
}

}  // namespace
}  // namespace tessera_cuda

using namespace tessera_cuda;  // NOLINT: the extern "C" entry points below

#define TESSERA_UNARY(suffix, S)                                                         \
  extern "C" __global__ void tessera_unary_##suffix(int op, int64_t n, const S* x, S* y, \
                                                    double alpha, double beta) {         \
    Unary<S>(op, n, x, y, alpha, beta);                                                  \
  }
TESSERA_UNARY(f32, float)
TESSERA_UNARY(f16, __half)
TESSERA_UNARY(bf16, __nv_bfloat16)
TESSERA_UNARY(f64, double)
TESSERA_UNARY(i32, int32_t)
TESSERA_UNARY(i64, int64_t)

#define TESSERA_BINARY(suffix, S)                                                        \
  extern "C" __global__ void tessera_binary_##suffix(int op, BinaryParams p, const S* a, \
                                                     const S* b, S* y) {                 \
    Binary<S>(op, p, a, b, y);                                                           \
  }
TESSERA_BINARY(f32, float)
TESSERA_BINARY(f16, __half)
TESSERA_BINARY(bf16, __nv_bfloat16)
TESSERA_BINARY(f64, double)
TESSERA_BINARY(i32, int32_t)
TESSERA_BINARY(i64, int64_t)
TESSERA_BINARY(u8, uint8_t)

extern "C" __global__ void tessera_cast(int64_t n, const void* x, int src, void* y, int dst) {
  for (int64_t i = GlobalThread(); i < n; i += GlobalStride()) {
    StoreAny(y, dst, i, LoadAny(x, src, i), src == kF64);
  }
}

extern "C" __global__ void tessera_fill(int64_t n, void* y, int dst, double value) {
  const Value v{true, value, 0};
  for (int64_t i = GlobalThread(); i < n; i += GlobalStride()) StoreAny(y, dst, i, v, true);
}

#define TESSERA_PERMUTE(bytes, T)                                                         \
  extern "C" __global__ void tessera_permute_##bytes(PermuteParams p, const T* x, T* y) { \
    Permute<T>(p, x, y);                                                                  \
  }
TESSERA_PERMUTE(1, uint8_t)
TESSERA_PERMUTE(2, uint16_t)
TESSERA_PERMUTE(4, uint32_t)
TESSERA_PERMUTE(8, uint64_t)

// Test-only: an illegal address, the sticky fault the backend must contain to one tenant.
extern "C" __global__ void tessera_test_fault(int64_t address) {
  *reinterpret_cast<volatile int*>(address) = 1;
}
