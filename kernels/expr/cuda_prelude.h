#ifndef TESSERA_KERNELS_EXPR_CUDA_PRELUDE_H_
#define TESSERA_KERNELS_EXPR_CUDA_PRELUDE_H_

// The device functions every generated kernel (cuda_codegen.h) starts with: conversions with
// the CPU's rounding (kernels/dtype.cc) and the total integer operations of ast.h. No
// #include: NVRTC has no host headers, and the same text compiles as host C++ for the fake
// driver (tests/fake_cuda/driver/device.h supplies the intrinsics used here).

namespace tessera::kernels::expr {

inline constexpr char kCudaPrelude[] = R"(typedef long long tk_i64;
typedef unsigned long long tk_u64;
typedef unsigned int tk_u32;
typedef unsigned short tk_u16;
typedef unsigned char tk_u8;

#define TK_I64_MIN (-9223372036854775807LL - 1LL)
#define TK_I64_MAX 9223372036854775807LL

// ---- f16 and bf16, as kernels/dtype.cc converts them ----
static __device__ __forceinline__ float tk_f16_to_f32(tk_u16 h) {
  const tk_u32 sign = (tk_u32)(h & 0x8000u) << 16;
  const tk_u32 exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact
    return __uint_as_float(sign | __float_as_uint((float)mantissa * 5.9604644775390625e-8f));
  }
  if (exponent == 31) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
static __device__ __forceinline__ float tk_bf16_to_f32(tk_u16 h) {
  return __uint_as_float((tk_u32)h << 16);
}
static __device__ __forceinline__ tk_u16 tk_f32_to_f16(float value) {
  tk_u32 f = __float_as_uint(value);
  const tk_u32 sign = (f >> 16) & 0x8000u;
  f &= 0x7fffffffu;
  if (f >= 0x47800000u) return (tk_u16)(sign | (f > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (f < 0x38800000u) {  // subnormal or zero: the FPU rounds at the half's last place
    const tk_u32 magic = 126u << 23;
    const float shifted = __uint_as_float(f) + __uint_as_float(magic);
    return (tk_u16)(sign | (__float_as_uint(shifted) - magic));
  }
  const tk_u32 odd = (f >> 13) & 1u;
  f -= 112u << 23;
  f += 0xfffu + odd;
  return (tk_u16)(sign | (f >> 13));
}
static __device__ __forceinline__ tk_u16 tk_f32_to_bf16(float value) {
  tk_u32 x = __float_as_uint(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (tk_u16)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (tk_u16)(x >> 16);
}
// The f32 nearest to v toward zero, odd when inexact: rounding it again rounds v once.
static __device__ __forceinline__ float tk_round_odd_f32(double v) {
  float f = (float)v;
  if (v != v || (double)f == v) return f;
  if (fabs((double)f) > fabs(v)) f = __uint_as_float(__float_as_uint(f) - 1u);
  return __uint_as_float(__float_as_uint(f) | 1u);
}

// ---- floats to integers: truncated, saturated, NaN to 0 ----
static __device__ __forceinline__ tk_i64 tk_f64_to_i64(double v) {
  if (v != v) return 0;
  v = trunc(v);
  if (v <= -9223372036854775808.0) return TK_I64_MIN;
  if (v >= 9223372036854775808.0) return TK_I64_MAX;
  return (tk_i64)v;
}
static __device__ __forceinline__ int tk_f64_to_i32(double v) {
  if (v != v) return 0;
  v = trunc(v);
  if (v <= -2147483648.0) return (int)(-2147483647 - 1);
  if (v >= 2147483647.0) return 2147483647;
  return (int)v;
}
static __device__ __forceinline__ tk_u8 tk_f64_to_u8(double v) {
  if (v != v) return 0;
  v = trunc(v);
  if (v <= 0.0) return 0;
  if (v >= 255.0) return 255;
  return (tk_u8)v;
}
static __device__ __forceinline__ int tk_i64_to_i32(tk_i64 v) {
  return v < -2147483648LL ? (int)(-2147483647 - 1) : v > 2147483647LL ? 2147483647 : (int)v;
}
static __device__ __forceinline__ tk_u8 tk_i64_to_u8(tk_i64 v) {
  return v < 0 ? (tk_u8)0 : v > 255 ? (tk_u8)255 : (tk_u8)v;
}

// ---- integers: two's complement wrapping, division and remainder total ----
static __device__ __forceinline__ tk_i64 tk_add_i64(tk_i64 a, tk_i64 b) {
  return (tk_i64)((tk_u64)a + (tk_u64)b);
}
static __device__ __forceinline__ tk_i64 tk_sub_i64(tk_i64 a, tk_i64 b) {
  return (tk_i64)((tk_u64)a - (tk_u64)b);
}
static __device__ __forceinline__ tk_i64 tk_mul_i64(tk_i64 a, tk_i64 b) {
  return (tk_i64)((tk_u64)a * (tk_u64)b);
}
static __device__ __forceinline__ tk_i64 tk_neg_i64(tk_i64 a) { return (tk_i64)(0ull - (tk_u64)a); }
static __device__ __forceinline__ tk_i64 tk_div_i64(tk_i64 a, tk_i64 b) {
  if (b == 0) return 0;
  if (b == -1) return tk_neg_i64(a);  // INT64_MIN / -1 wraps
  return a / b;
}
static __device__ __forceinline__ tk_i64 tk_mod_i64(tk_i64 a, tk_i64 b) {
  if (b == 0 || b == -1) return 0;
  return a % b;
}
static __device__ __forceinline__ tk_i64 tk_abs_i64(tk_i64 a) { return a < 0 ? tk_neg_i64(a) : a; }
// Shifts by a count outside 0..63 shift every bit out; >> is arithmetic, written on
// non-negative values only (no implementation-defined shift).
static __device__ __forceinline__ tk_i64 tk_shl_i64(tk_i64 a, tk_i64 n) {
  return (n < 0 || n > 63) ? 0 : (tk_i64)((tk_u64)a << n);
}
static __device__ __forceinline__ tk_i64 tk_shr_i64(tk_i64 a, tk_i64 n) {
  if (n < 0 || n > 63) return a < 0 ? -1 : 0;
  return a < 0 ? ~(~a >> n) : a >> n;
}
static __device__ __forceinline__ tk_i64 tk_max_i64(tk_i64 a, tk_i64 b) { return a > b ? a : b; }
static __device__ __forceinline__ tk_i64 tk_min_i64(tk_i64 a, tk_i64 b) { return a < b ? a : b; }

// ---- the catalog's float formulas (kernels/cuda/elementwise.cu) ----
static __device__ __forceinline__ float tk_relu_f32(float x) { return x < 0.0f ? 0.0f : x; }
static __device__ __forceinline__ double tk_relu_f64(double x) { return x < 0.0 ? 0.0 : x; }
static __device__ __forceinline__ float tk_gelu_f32(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}
static __device__ __forceinline__ double tk_gelu_f64(double x) {
  return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
}
static __device__ __forceinline__ float tk_sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ double tk_sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }
static __device__ __forceinline__ float tk_rsqrt_f32(float x) { return 1.0f / sqrtf(x); }
static __device__ __forceinline__ double tk_rsqrt_f64(double x) { return 1.0 / sqrt(x); }
// isinf and isfinite by magnitude (NaN compares false).
static __device__ __forceinline__ bool tk_isinf_f32(float x) { return fabsf(x) == __uint_as_float(0x7f800000u); }
static __device__ __forceinline__ bool tk_isinf_f64(double x) { return fabs(x) == __longlong_as_double(0x7ff0000000000000LL); }
static __device__ __forceinline__ bool tk_isfinite_f32(float x) { return fabsf(x) <= __uint_as_float(0x7f7fffffu); }
static __device__ __forceinline__ bool tk_isfinite_f64(double x) { return fabs(x) <= __longlong_as_double(0x7fefffffffffffffLL); }
// maximum and minimum: NaN wins.
static __device__ __forceinline__ float tk_max_f32(float a, float b) { return (a != a || a > b) ? a : b; }
static __device__ __forceinline__ double tk_max_f64(double a, double b) { return (a != a || a > b) ? a : b; }
static __device__ __forceinline__ float tk_min_f32(float a, float b) { return (a != a || a < b) ? a : b; }
static __device__ __forceinline__ double tk_min_f64(double a, double b) { return (a != a || a < b) ? a : b; }
)";

}  // namespace tessera::kernels::expr

#endif  // TESSERA_KERNELS_EXPR_CUDA_PRELUDE_H_
