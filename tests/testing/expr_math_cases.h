#ifndef TESSERA_TESTS_TESTING_EXPR_MATH_CASES_H_
#define TESSERA_TESTS_TESTING_EXPR_MATH_CASES_H_

// The math functions of tenant-defined kernels that come from the C library (CPU) and CUDA's
// math library (device), checked the same way on both backends: each function, for each float
// dtype, as a one-line kernel over edge values (±0, subnormals, ±inf, NaN, the edges of its
// domain and just past them, halfway cases of round) and random values, against a long-double
// evaluation within the bound kernels/accuracy.h documents for it. Used by
// tests/unit/kernels/accuracy_test.cc (the CPU backend) and tests/fake_cuda/user_kernels_test.cc
// (the generated CUDA over the fake driver).
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "kernels/accuracy.h"
#include "kernels/dtype.h"
#include "tests/testing/host_tensor.h"

namespace tessera::testing {

struct MathCase {
  const char* name;  // the language's function, and kernels::BoundFor's name
  long double (*exact)(long double, long double);
  int arity = 1;
  bool predicate = false;    // a bool result (isnan, isinf, isfinite)
  double lo = -10, hi = 10;  // random arguments
};

inline const std::vector<MathCase>& MathCases() {
  using R = long double;
  static const std::vector<MathCase>* const cases = new std::vector<MathCase>{
      {"sin", [](R x, R) { return std::sin(x); }, 1, false, -100, 100},
      {"cos", [](R x, R) { return std::cos(x); }, 1, false, -100, 100},
      {"tan", [](R x, R) { return std::tan(x); }, 1, false, -10, 10},
      {"arcsin", [](R x, R) { return std::asin(x); }, 1, false, -1, 1},
      {"arccos", [](R x, R) { return std::acos(x); }, 1, false, -1, 1},
      {"arctan", [](R x, R) { return std::atan(x); }, 1, false, -100, 100},
      {"arctan2", [](R y, R x) { return std::atan2(y, x); }, 2, false, -10, 10},
      {"sinh", [](R x, R) { return std::sinh(x); }, 1, false, -100, 100},
      {"cosh", [](R x, R) { return std::cosh(x); }, 1, false, -100, 100},
      {"arcsinh", [](R x, R) { return std::asinh(x); }, 1, false, -1e6, 1e6},
      {"arccosh", [](R x, R) { return std::acosh(x); }, 1, false, 1, 1e6},
      {"arctanh", [](R x, R) { return std::atanh(x); }, 1, false, -1, 1},
      {"log10", [](R x, R) { return std::log10(x); }, 1, false, 0, 1e6},
      {"log2", [](R x, R) { return std::log2(x); }, 1, false, 0, 1e6},
      {"log1p", [](R x, R) { return std::log1p(x); }, 1, false, -1, 10},
      {"exp2", [](R x, R) { return std::exp2(x); }, 1, false, -150, 150},
      {"expm1", [](R x, R) { return std::expm1(x); }, 1, false, -20, 20},
      {"cbrt", [](R x, R) { return std::cbrt(x); }, 1, false, -1e6, 1e6},
      {"hypot", [](R x, R y) { return std::hypot(x, y); }, 2, false, -1e4, 1e4},
      {"ceil", [](R x, R) { return std::ceil(x); }, 1, false, -10, 10},
      {"floor", [](R x, R) { return std::floor(x); }, 1, false, -10, 10},
      {"trunc", [](R x, R) { return std::trunc(x); }, 1, false, -10, 10},
      {"round", [](R x, R) { return std::nearbyint(x); }, 1, false, -10, 10},  // half to even
      {"copysign", [](R x, R y) { return std::copysign(x, y); }, 2, false, -10, 10},
      {"isnan", [](R x, R) { return R(std::isnan(x)); }, 1, true},
      {"isinf", [](R x, R) { return R(std::isinf(x)); }, 1, true},
      {"isfinite", [](R x, R) { return R(std::isfinite(x)); }, 1, true},
  };
  return *cases;
}

/// The float dtypes every case runs on.
inline constexpr kernels::DType kMathDTypes[] = {kernels::DType::kF32, kernels::DType::kF16,
                                                 kernels::DType::kBF16, kernels::DType::kF64};

/// The one-line kernel of `c` over `dtype`: y = f(x) (or f(x, w)).
inline std::string MathCaseSource(const MathCase& c, kernels::DType dtype) {
  const std::string t(kernels::DTypeName(dtype));
  return absl::StrCat("kernel math_", c.name, "(x: ", t,
                      c.arity == 2 ? absl::StrCat(", w: ", t) : "",
                      ") -> (y: ", c.predicate ? "bool" : t, ")\n{\n  y = ", c.name, "(x",
                      c.arity == 2 ? ", w" : "", ")\n}\n");
}

/// One kernel of `c` over every dtype of kMathDTypes: inputs x0..x3 (and w0..w3), outputs
/// y0..y3, y<k> = f(x<k>) in kMathDTypes[k]; one compilation for all four.
inline std::string MathCaseSourceAllDTypes(const MathCase& c) {
  std::string inputs, outputs, body;
  for (int k = 0; k < 4; ++k) {
    const std::string t(kernels::DTypeName(kMathDTypes[k]));
    absl::StrAppend(&inputs, k > 0 ? ", " : "", "x", k, ": ", t);
    if (c.arity == 2) absl::StrAppend(&inputs, ", w", k, ": ", t);
    absl::StrAppend(&outputs, k > 0 ? ", " : "", "y", k, ": ", c.predicate ? "bool" : t);
    absl::StrAppend(&body, "  y", k, " = ", c.name, "(x", k,
                    c.arity == 2 ? absl::StrCat(", w", k) : "", ")\n");
  }
  return absl::StrCat("kernel math_", c.name, "(", inputs, ") -> (", outputs, ")\n{\n", body,
                      "}\n");
}

/// Edge values: ±0, subnormals of each type, ±inf, NaN, the domains' edges and just past them
/// (±1 for arcsin, arccos, arctanh; 1 for arccosh; -1 for log1p; 0 for the logarithms), the
/// overflow thresholds of sinh, cosh, exp2 and expm1, halfway cases of round, large arguments of
/// the trigonometric functions.
inline std::vector<double> MathEdgeValues() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  return {0.0,
          -0.0,
          1.0,
          -1.0,
          0.5,
          -0.5,
          1.5,
          2.5,
          -2.5,
          3.5,
          -0.49999997,
          1e-40,
          -1e-40,
          1e-310,
          -5e-324,
          1e-30,
          1e-7,
          -1e-7,
          1.0000001,
          -1.0000001,
          0.9999999,
          -0.9999999,
          2,
          10,
          0.1,
          1024,
          89,
          -89,
          90,
          -104,
          128,
          -150,
          710,
          -745,
          1100,
          1e30,
          -1e30,
          1e300,
          3.14159265358979,
          1.5707963267948966,
          1e6,
          4503599627370497.0,
          8388609.0,
          65504,
          kInf,
          -kInf,
          std::nan("")};
}

/// The inputs of `c` over `dtype`: [n] for a one-argument function; for two, every pair of
/// edge values, then random pairs.
inline std::vector<HostTensor> MathCaseInputs(const MathCase& c, kernels::DType dtype,
                                              std::mt19937& rng) {
  const std::vector<double> edges = MathEdgeValues();
  std::uniform_real_distribution<double> uniform(c.lo, c.hi);
  std::uniform_real_distribution<double> exponent(-40, 40);
  std::vector<std::pair<double, double>> values;
  if (c.arity == 2) {
    for (double a : edges) {
      for (double b : edges) values.emplace_back(a, b);
    }
  } else {
    for (double a : edges) values.emplace_back(a, 0);
  }
  for (int i = 0; i < 2000; ++i) {
    // Half uniform over the function's range, half of any magnitude and sign.
    auto draw = [&] {
      return i % 2 == 0 ? uniform(rng) : (rng() % 2 ? 1 : -1) * std::pow(10.0, exponent(rng));
    };
    const double a = draw();
    values.emplace_back(a, draw());
  }
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<HostTensor> in;
  in.emplace_back(dtype, kernels::Shape{n});
  if (c.arity == 2) in.emplace_back(dtype, kernels::Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    in[0].Set(i, values[static_cast<size_t>(i)].first);
    if (c.arity == 2) in[1].Set(i, values[static_cast<size_t>(i)].second);
  }
  return in;
}

/// "" when every element of `out` is within the documented bound of the exact value for the
/// inputs as stored in `in` (f16/bf16 arguments as their own values), else the first failures.
inline std::string CheckMathCase(const MathCase& c, kernels::DType dtype,
                                 const std::vector<HostTensor>& in, const HostTensor& out) {
  const kernels::AccuracyBound bound = kernels::BoundFor(c.name, dtype);
  if (std::isnan(bound.ulps)) return absl::StrCat(c.name, " has no documented bound");
  std::string failures;
  int count = 0;
  for (int64_t i = 0; i < out.size() && count < 5; ++i) {
    const double x = in[0].Get(i);
    const double w = c.arity == 2 ? in[1].Get(i) : 0;
    const long double exact = c.exact(x, w);
    const double got = out.Get(i);
    const bool ok = c.predicate ? static_cast<double>(exact) == got
                                : kernels::WithinBound(bound, dtype, exact, got);
    if (ok) continue;
    ++count;
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%s(%.17g%s) on %s: got %.17g, exact %.17Lg (%.3g ulp; bound %g)\n", c.name, x,
                  c.arity == 2 ? absl::StrCat(", ", w).c_str() : "",
                  std::string(kernels::DTypeName(dtype)).c_str(), got, exact,
                  std::fabs(got - static_cast<double>(exact)) /
                      kernels::UlpOf(dtype, static_cast<double>(exact)),
                  bound.ulps);
    failures += line;
  }
  return failures;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_EXPR_MATH_CASES_H_
