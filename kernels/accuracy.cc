#include "kernels/accuracy.h"

#include <cmath>
#include <limits>
#include <string>

namespace tessera::kernels {
namespace {

// Significand bits after the point, smallest normal exponent, largest finite value.
struct Format {
  int mantissa;
  int min_exponent;
  double max;
};

Format FormatOf(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return {10, -14, 65504.0};
    case DType::kBF16:
      return {7, -126, 3.3895313892515355e38};
    case DType::kF64:
      return {52, -1022, std::numeric_limits<double>::max()};
    default:
      return {23, -126, std::numeric_limits<float>::max()};
  }
}

bool Exact(std::string_view k) {
  return k == "copy" || k == "transpose" || k == "max" || k == "min" || k == "maximum" ||
         k == "minimum" || k == "relu" || k == "neg" || k == "abs" || k == "argmax" ||
         // Tenant-kernel functions whose results are representable: exact on every backend.
         k == "ceil" || k == "floor" || k == "trunc" || k == "round" || k == "copysign" ||
         k == "isnan" || k == "isinf" || k == "isfinite";
}

// The tenant-kernel functions (docs/kernels.md) that the C library (CPU) and CUDA's math
// library (device) approximate: ulps against the exact value. Each is CUDA's documented
// maximum error (CUDA C++ Programming Guide, "Mathematical Functions", against the correctly
// rounded result; the larger of its f32 and f64 figures) plus the half ulp between the
// correctly rounded and the exact result, rounded up; glibc's documented errors for x86-64
// and AArch64 (libm-test-ulps) are within these.
struct LibmBound {
  std::string_view name;
  double ulps;
};
constexpr LibmBound kLibmBounds[] = {
    {"sin", 3},     {"cos", 3},     {"tan", 5},   {"arcsin", 3}, {"arccos", 3},
    {"arctan", 3},  {"arctan2", 4}, {"sinh", 4},  {"cosh", 3},   {"arcsinh", 4},
    {"arccosh", 5}, {"arctanh", 4}, {"log10", 3}, {"log2", 3},   {"log1p", 3},
    {"exp2", 3},    {"expm1", 3},   {"cbrt", 4},  {"hypot", 4},
};

}  // namespace

double UlpOf(DType dtype, double x) {
  const Format f = FormatOf(dtype);
  const double a = std::fabs(x);
  int exponent = a == 0 || !std::isfinite(a) ? f.min_exponent : std::ilogb(a);
  if (exponent < f.min_exponent) exponent = f.min_exponent;
  return std::ldexp(1.0, exponent - f.mantissa);
}

AccuracyBound BoundFor(std::string_view k, DType dtype) {
  if (!IsFloating(dtype) || Exact(k)) return {};
  // f16 and bf16 are computed in f32 and rounded once: half an ulp of their own, plus what f32
  // adds, which is below a further half ulp for every kernel here.
  const bool narrow = dtype == DType::kF16 || dtype == DType::kBF16;
  auto ulps = [&](double wide) { return narrow ? 1.0 : wide; };
  if (k == "add" || k == "sub" || k == "mul" || k == "div" || k == "sqrt" || k == "cast" ||
      k == "fill") {
    return {ulps(0.5), 0, false};  // correctly rounded
  }
  if (k == "rsqrt") return {ulps(1.5), 0, false};  // 1 / sqrt(x): two roundings
  if (k == "exp" || k == "log") return {ulps(2), 0, false};
  if (k == "tanh" || k == "sigmoid" || k == "pow") return {ulps(4), 0, false};
  for (const LibmBound& b : kLibmBounds) {
    if (b.name == k) return {ulps(b.ulps), 0, false};
  }
  if (k == "gelu") return {ulps(4), 4, false};     // 1 + erf(x / sqrt 2) cancels for x < 0
  if (k == "scale") return {ulps(0.5), 1, false};  // alpha x + beta, fused or not
  if (k == "sum" || k == "mean" || k == "matmul") return {ulps(0.5), 1, true};
  if (k == "softmax" || k == "log_softmax" || k == "layer_norm" || k == "rms_norm") {
    return {ulps(4), 4, true};
  }
  return {std::numeric_limits<double>::quiet_NaN(), 0, false};
}

namespace {

double Allowance(const AccuracyBound& b, DType dtype, double exact, double magnitude,
                 double terms) {
  const Format f = FormatOf(dtype);
  const double eps = std::ldexp(1.0, -f.mantissa);
  const double growth = b.grows_with_terms ? std::log2(std::max(terms, 1.0)) + 1 : 1;
  const double terms_part =
      b.terms_ulps == 0 || !std::isfinite(magnitude) ? 0 : b.terms_ulps * growth * eps * magnitude;
  return b.ulps * UlpOf(dtype, exact) + terms_part + std::ldexp(1.0, f.min_exponent - 1);
}

bool Special(DType dtype, double exact, double got, bool* verdict) {
  if (std::isnan(exact)) {
    *verdict = std::isnan(got);
    return true;
  }
  if (std::isnan(got)) {
    *verdict = false;
    return true;
  }
  // Beyond the largest finite value (by more than half an ulp): it rounds to infinity.
  const Format f = FormatOf(dtype);
  const double overflow = f.max + UlpOf(dtype, f.max) / 2;
  if (std::isinf(exact) || std::fabs(exact) >= overflow) {
    *verdict = std::isinf(got) && std::signbit(got) == std::signbit(exact);
    return true;
  }
  if (std::isinf(got)) {
    *verdict = false;
    return true;
  }
  return false;
}

}  // namespace

bool WithinBound(const AccuracyBound& bound, DType dtype, long double exact, double got,
                 double magnitude, double terms) {
  if (std::isnan(bound.ulps)) return false;
  const double rounded = static_cast<double>(exact);
  if (!IsFloating(dtype)) return rounded == got;
  bool verdict = false;
  if (Special(dtype, rounded, got, &verdict)) return verdict;
  return std::fabs(static_cast<long double>(got) - exact) <=
         static_cast<long double>(Allowance(bound, dtype, rounded, magnitude, terms));
}

bool BackendsAgree(const AccuracyBound& bound, DType dtype, double reference, double other,
                   double magnitude, double terms) {
  if (std::isnan(bound.ulps)) return false;
  if (!IsFloating(dtype)) return reference == other;
  bool verdict = false;
  if (Special(dtype, reference, other, &verdict)) return verdict;
  return std::fabs(other - reference) <= 2 * Allowance(bound, dtype, reference, magnitude, terms);
}

}  // namespace tessera::kernels
