#ifndef TESSERA_KERNELS_EXPR_SEMANTICS_H_
#define TESSERA_KERNELS_EXPR_SEMANTICS_H_

// The scalar meaning of every operation of a tenant-defined kernel (kernels/expr/ast.h), in
// plain C++ (the standard library only): the CPU backend's loops are built from these
// functions, and a device code generator emits the same formulas. Every function is total:
// no input has undefined behaviour, traps or raises.
//
// Compute types: bool (as uint8_t, 0 or 1), int64_t, float, double.
//
// Integers wrap (two's complement); x / 0 and x % 0 give 0; INT64_MIN / -1 gives INT64_MIN
// and INT64_MIN % -1 gives 0. Shifts by a count outside 0..63 give 0 (<<) or the sign fill
// (>>, arithmetic). Floats follow IEEE 754 in round-to-nearest (inf, NaN, -0);
// kMod on floats is fmod. maximum and minimum return NaN when either side is NaN.
//
// Conversions: to bool is `!= 0` (NaN gives true); float to integer truncates toward zero,
// saturates at the target's bounds and gives 0 for NaN; integer to a narrower integer
// saturates (as the catalog's cast); to f16/bf16 rounds to nearest even (kernels/dtype.h).
//
// Reductions: identities of an empty reduction are 0 (sum), 1 (prod), +inf or INT64_MAX
// (min), -inf or INT64_MIN (max), index 0 (argmin, argmax). min and max return NaN once a NaN
// is seen; argmin and argmax return the first index of the extreme value, a NaN counting as
// larger than everything for argmax and smaller than everything for argmin (so the first NaN
// wins both).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace tessera::kernels::expr::semantics {

// ---- integers ------------------------------------------------------------------------------

constexpr int64_t AddI64(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
constexpr int64_t SubI64(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
constexpr int64_t MulI64(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
constexpr int64_t NegI64(int64_t a) { return static_cast<int64_t>(0 - static_cast<uint64_t>(a)); }
constexpr int64_t AbsI64(int64_t a) { return a < 0 ? NegI64(a) : a; }
constexpr int64_t DivI64(int64_t a, int64_t b) { return b == 0 ? 0 : b == -1 ? NegI64(a) : a / b; }
constexpr int64_t ModI64(int64_t a, int64_t b) { return b == 0 || b == -1 ? 0 : a % b; }
/// `a << n`: the bits shifted out are lost (wraps); a count outside 0..63 shifts every bit
/// out, giving 0.
constexpr int64_t ShlI64(int64_t a, int64_t n) {
  return n < 0 || n > 63 ? 0 : static_cast<int64_t>(static_cast<uint64_t>(a) << n);
}
/// `a >> n`: arithmetic (copies of the sign bit come in); a count outside 0..63 shifts every
/// bit out, giving 0 or -1 by the sign of `a`. Written on non-negative values only, so that
/// no implementation-defined shift is involved.
constexpr int64_t ShrI64(int64_t a, int64_t n) {
  if (n < 0 || n > 63) return a < 0 ? -1 : 0;
  return a < 0 ? ~(~a >> n) : a >> n;
}

// ---- math (float and double; Abs, Maximum, Minimum also int64_t) ----------------------------

template <typename T>
T Abs(T x) {
  if constexpr (std::is_integral_v<T>) {
    return AbsI64(x);
  } else {
    return std::fabs(x);
  }
}
template <typename T>
constexpr T Maximum(T a, T b) {
  return (a != a || a > b) ? a : b;  // NaN wins; on ties (and +0 vs -0) `b`
}
template <typename T>
constexpr T Minimum(T a, T b) {
  return (a != a || a < b) ? a : b;
}
template <typename T>
constexpr T Relu(T x) {
  return x < T(0) ? T(0) : x;  // NaN and -0 pass through
}
/// Two correctly rounded operations, as the catalog's rsqrt.
template <typename T>
T Rsqrt(T x) {
  return T(1) / std::sqrt(x);
}
/// The catalog's formula; the CPU backend evaluates exp vectorized (within the catalog's
/// sigmoid bound, kernels/accuracy.h).
template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
/// The exact (erf) form, as the catalog's gelu.
template <typename T>
T Gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
}

// ---- conversions -----------------------------------------------------------------------------

/// Float to a C++ integer type: truncation, saturation, NaN to 0.
template <typename I>
I FloatToInt(double v) {
  if (v != v) return 0;
  if (v <= static_cast<double>(std::numeric_limits<I>::lowest())) {
    return std::numeric_limits<I>::lowest();
  }
  // For int64_t the bound rounds up to 2^63, which is out of range: >= catches it.
  if (v >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

/// int64_t to a narrower C++ integer type, saturating.
template <typename I>
constexpr I SaturateInt(int64_t v) {
  if (v < static_cast<int64_t>(std::numeric_limits<I>::lowest())) {
    return std::numeric_limits<I>::lowest();
  }
  if (v > static_cast<int64_t>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

/// A value of one compute type as another; uint8_t is bool.
template <typename To, typename From>
To Convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, uint8_t>) {
    return v != From(0) ? 1 : 0;
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return FloatToInt<To>(static_cast<double>(v));
  } else {
    return static_cast<To>(v);  // widening, or one IEEE rounding to nearest
  }
}

// ---- reductions ------------------------------------------------------------------------------

/// min/max combine step: NaN, once seen, stays; otherwise the first extreme value.
template <bool kMax, typename T>
constexpr T CombineExtreme(T acc, T x) {
  if (acc != acc) return acc;
  if (x != x) return x;
  if constexpr (kMax) {
    return x > acc ? x : acc;
  } else {
    return x < acc ? x : acc;
  }
}

/// Whether `x`, later in order, replaces `best` in argmax (kMax) or argmin.
template <bool kMax, typename T>
constexpr bool ArgReplaces(T x, T best) {
  if (best != best) return false;
  if (x != x) return true;
  if constexpr (kMax) {
    return x > best;
  } else {
    return x < best;
  }
}

}  // namespace tessera::kernels::expr::semantics

#endif  // TESSERA_KERNELS_EXPR_SEMANTICS_H_
