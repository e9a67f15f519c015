// Every floating-point kernel of the catalog, for every float dtype, against a long-double
// evaluation of its definition, within the bound kernels/accuracy.h documents. The kernels are
// enumerated from the registry: a float kernel without a reference here fails.
#include "kernels/accuracy.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/expr/compile.h"
#include "kernels/expr/user_kernel.h"
#include "kernels/registry.h"
#include "tests/testing/expr_math_cases.h"
#include "tests/testing/host_tensor.h"

namespace tessera::kernels {
namespace {

using testing::HostTensor;
using Real = long double;

// What one kernel is checked on: its inputs and attributes for `dtype`, and the exact value,
// magnitude and term count of output element `i`.
struct Expected {
  Real exact;
  double magnitude = 0;
  double terms = 1;
};
struct Check {
  std::function<std::vector<HostTensor>(DType, std::mt19937&)> inputs;
  Attrs attrs;
  std::function<Expected(const std::vector<HostTensor>&, int64_t)> expect;
};

HostTensor RandomTensor(DType d, Shape shape, double lo, double hi, std::mt19937& gen,
                        std::vector<double> extra = {}) {
  HostTensor t(d, std::move(shape));
  t.Randomize(gen, lo, hi);
  for (size_t i = 0; i < extra.size() && static_cast<int64_t>(i) < t.size(); ++i) {
    t.Set(static_cast<int64_t>(i), extra[i]);
  }
  return t;
}

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::nan("");
// Edge values first, then random ones in [lo, hi].
const std::vector<double> kSigned = {0.0,  -0.0,  1e-30, -1e-30, 80,   -80,
                                     1e30, -1e30, kInf,  -kInf,  kNan, 1e-42};
const std::vector<double> kPositive = {0.0, 1e-30, 1e-42, 80, 1e30, kInf, kNan, 1};

Check Unary(std::function<Real(Real)> f, double lo, double hi, std::vector<double> extra,
            Attrs attrs = {}) {
  return Check{[=](DType d, std::mt19937& gen) {
                 return std::vector<HostTensor>{RandomTensor(d, {5000}, lo, hi, gen, extra)};
               },
               attrs,
               [=](const std::vector<HostTensor>& in, int64_t i) {
                 const Real x = in[0].Get(i);
                 return Expected{f(x), std::fabs(static_cast<double>(x))};
               }};
}

Check Binary(std::function<Real(Real, Real)> f, double lo, double hi) {
  return Check{[=](DType d, std::mt19937& gen) {
                 return std::vector<HostTensor>{RandomTensor(d, {5000}, lo, hi, gen),
                                                RandomTensor(d, {5000}, lo, hi, gen)};
               },
               {},
               [=](const std::vector<HostTensor>& in, int64_t i) {
                 return Expected{f(in[0].Get(i), in[1].Get(i))};
               }};
}

constexpr int64_t kRows = 6, kWidth = 1000;

// Row-wise kernels over [kRows, kWidth]: `f` gets the row and the index within it.
Check Rows(std::function<Expected(const std::vector<Real>&, int64_t)> f, double lo, double hi,
           Attrs attrs = {}) {
  return Check{[=](DType d, std::mt19937& gen) {
                 return std::vector<HostTensor>{RandomTensor(d, {kRows, kWidth}, lo, hi, gen)};
               },
               attrs,
               [=](const std::vector<HostTensor>& in, int64_t i) {
                 std::vector<Real> row(kWidth);
                 const int64_t r = i / kWidth;
                 for (int64_t k = 0; k < kWidth; ++k) row[k] = in[0].Get(r * kWidth + k);
                 return f(row, i % kWidth);
               }};
}

// Reductions of [kRows, kWidth] over the last axis: `f` gets row `i`.
Check Reduction(std::function<Expected(const std::vector<Real>&)> f, double lo, double hi) {
  return Check{[=](DType d, std::mt19937& gen) {
                 return std::vector<HostTensor>{RandomTensor(d, {kRows, kWidth}, lo, hi, gen)};
               },
               {{"axes", std::vector<int64_t>{1}}},
               [=](const std::vector<HostTensor>& in, int64_t i) {
                 std::vector<Real> row(kWidth);
                 for (int64_t k = 0; k < kWidth; ++k) row[k] = in[0].Get(i * kWidth + k);
                 return f(row);
               }};
}

Real Sum(const std::vector<Real>& v) {
  Real s = 0;
  for (Real x : v) s += x;
  return s;
}
double AbsSum(const std::vector<Real>& v) {
  Real s = 0;
  for (Real x : v) s += std::fabs(x);
  return static_cast<double>(s);
}

std::map<std::string, Check> Checks() {
  std::map<std::string, Check> c;
  c["neg"] = Unary([](Real x) { return -x; }, -4, 4, kSigned);
  c["abs"] = Unary([](Real x) { return std::fabs(x); }, -4, 4, kSigned);
  c["relu"] = Unary([](Real x) { return x < 0 ? Real(0) : x; }, -4, 4, kSigned);
  c["exp"] = Unary([](Real x) { return std::exp(x); }, -100, 100, kSigned);
  c["log"] = Unary([](Real x) { return std::log(x); }, 1e-6, 1e6, kPositive);
  c["sqrt"] = Unary([](Real x) { return std::sqrt(x); }, 0, 1e6, kPositive);
  c["rsqrt"] = Unary([](Real x) { return 1 / std::sqrt(x); }, 1e-6, 1e6, kPositive);
  c["gelu"] = Unary([](Real x) { return x / 2 * (1 + std::erf(x / std::sqrt(Real(2)))); }, -10, 10,
                    kSigned);
  c["sigmoid"] = Unary([](Real x) { return 1 / (1 + std::exp(-x)); }, -100, 100, kSigned);
  c["tanh"] = Unary([](Real x) { return std::tanh(x); }, -10, 10, kSigned);
  {
    Check scale = Unary([](Real x) { return Real(1.5) * x - Real(0.25); }, -4, 4, kSigned,
                        {{"alpha", 1.5}, {"beta", -0.25}});
    auto exact = scale.expect;
    scale.expect = [exact](const std::vector<HostTensor>& in, int64_t i) {
      Expected e = exact(in, i);
      e.magnitude = 1.5 * e.magnitude + 0.25;
      return e;
    };
    c["scale"] = scale;
  }
  c["add"] = Binary([](Real a, Real b) { return a + b; }, -1e4, 1e4);
  c["sub"] = Binary([](Real a, Real b) { return a - b; }, -1e4, 1e4);
  c["mul"] = Binary([](Real a, Real b) { return a * b; }, -1e4, 1e4);
  c["div"] = Binary([](Real a, Real b) { return a / b; }, -1e4, 1e4);
  c["maximum"] = Binary([](Real a, Real b) { return a > b ? a : b; }, -1e4, 1e4);
  c["minimum"] = Binary([](Real a, Real b) { return a < b ? a : b; }, -1e4, 1e4);
  c["pow"] = Binary([](Real a, Real b) { return std::pow(a, b); }, 0.01, 8);
  c["sum"] = Reduction(
      [](const std::vector<Real>& r) {
        return Expected{Sum(r), AbsSum(r), kWidth};
      },
      -4, 4);
  c["mean"] = Reduction(
      [](const std::vector<Real>& r) {
        return Expected{Sum(r) / kWidth, AbsSum(r) / kWidth, kWidth};
      },
      -4, 4);
  c["max"] = Reduction(
      [](const std::vector<Real>& r) { return Expected{*std::max_element(r.begin(), r.end())}; },
      -4, 4);
  c["min"] = Reduction(
      [](const std::vector<Real>& r) { return Expected{*std::min_element(r.begin(), r.end())}; },
      -4, 4);
  auto softmax = [](const std::vector<Real>& r, int64_t k, bool log) {
    const Real max = *std::max_element(r.begin(), r.end());
    Real sum = 0;
    for (Real x : r) sum += std::exp(x - max);
    const Real value = log ? r[k] - max - std::log(sum) : std::exp(r[k] - max) / sum;
    return Expected{value, std::max(1.0, std::fabs(static_cast<double>(value))), kWidth};
  };
  c["softmax"] =
      Rows([=](const std::vector<Real>& r, int64_t k) { return softmax(r, k, false); }, -8, 8);
  c["log_softmax"] =
      Rows([=](const std::vector<Real>& r, int64_t k) { return softmax(r, k, true); }, -8, 8);
  auto norm = [](const std::vector<Real>& r, int64_t k, bool rms, double eps) {
    const Real mean = rms ? 0 : Sum(r) / kWidth;
    Real square = 0;
    for (Real x : r) square += (x - mean) * (x - mean);
    const Real value = (r[k] - mean) / std::sqrt(square / kWidth + eps);
    return Expected{value, std::max(1.0, std::fabs(static_cast<double>(value))), kWidth};
  };
  c["layer_norm"] =
      Rows([=](const std::vector<Real>& r, int64_t k) { return norm(r, k, false, 1e-5); }, -4, 4,
           {{"eps", 1e-5}});
  c["rms_norm"] =
      Rows([=](const std::vector<Real>& r, int64_t k) { return norm(r, k, true, 1e-5); }, -4, 4,
           {{"eps", 1e-5}});
  c["matmul"] = Check{[](DType d, std::mt19937& gen) {
                        return std::vector<HostTensor>{RandomTensor(d, {17, 300}, -2, 2, gen),
                                                       RandomTensor(d, {300, 9}, -2, 2, gen)};
                      },
                      {},
                      [](const std::vector<HostTensor>& in, int64_t i) {
                        const int64_t row = i / 9, col = i % 9;
                        Real sum = 0;
                        double magnitude = 0;
                        for (int64_t k = 0; k < 300; ++k) {
                          const Real p = Real(in[0].Get(row * 300 + k)) * in[1].Get(k * 9 + col);
                          sum += p;
                          magnitude += std::fabs(static_cast<double>(p));
                        }
                        return Expected{sum, magnitude, 300};
                      }};
  c["transpose"] = Check{[](DType d, std::mt19937& gen) {
                           return std::vector<HostTensor>{RandomTensor(d, {33, 65}, -4, 4, gen)};
                         },
                         {},
                         [](const std::vector<HostTensor>& in, int64_t i) {
                           return Expected{in[0].Get((i % 33) * 65 + i / 33)};
                         }};
  c["copy"] = Unary([](Real x) { return x; }, -4, 4, kSigned);
  return c;
}

class AccuracyTest : public ::testing::Test {
 protected:
  void SetUp() override { InitCpuKernels(); }
  testing::ThreadParallel parallel_{3};
};

TEST_F(AccuracyTest, EveryFloatKernelIsWithinItsDocumentedBound) {
  const std::map<std::string, Check> checks = Checks();
  std::mt19937 gen(2026);
  int pairs = 0;
  for (const KernelDef& def : Registry::Global().kernels()) {
    const std::vector<DType>& dtypes =
        def.inputs.empty() ? def.outputs[0].dtypes : def.inputs[0].dtypes;
    for (DType d : dtypes) {
      if (!IsFloating(d)) continue;
      SCOPED_TRACE(absl::StrCat(def.name, " ", DTypeName(d)));
      if (def.name == "cast" || def.name == "fill" || def.name == "argmax") continue;  // below
      const AccuracyBound bound = BoundFor(def.name, d);
      ASSERT_FALSE(std::isnan(bound.ulps)) << "no documented bound";
      auto check = checks.find(def.name);
      ASSERT_NE(check, checks.end()) << "no accuracy check for this kernel";
      const std::vector<HostTensor> in = check->second.inputs(d, gen);
      std::vector<TensorMeta> metas;
      std::vector<const void*> in_ptrs;
      for (const HostTensor& t : in) {
        metas.push_back(t.meta);
        in_ptrs.push_back(t.data());
      }
      auto plan = Registry::Global().Prepare(def.name, metas, check->second.attrs);
      ASSERT_TRUE(plan.ok()) << plan.status();
      HostTensor out(plan->outputs[0].dtype, plan->outputs[0].shape);
      std::vector<void*> out_ptrs = {out.data()};
      ASSERT_TRUE(RunCpuKernel(*plan, in_ptrs, out_ptrs, parallel_).ok());
      int failures = 0;
      for (int64_t i = 0; i < out.size() && failures < 5; ++i) {
        const Expected e = check->second.expect(in, i);
        const double got = out.Get(i);
        if (!WithinBound(bound, d, e.exact, got, e.magnitude, e.terms)) {
          ++failures;
          ADD_FAILURE() << "element " << i << " (input " << (i < in[0].size() ? in[0].Get(i) : 0)
                        << (in.size() > 1 && i < in[1].size() ? absl::StrCat(", ", in[1].Get(i))
                                                              : "")
                        << "): got " << got << ", exact " << static_cast<double>(e.exact) << " ("
                        << std::fabs(got - static_cast<double>(e.exact)) /
                               UlpOf(d, static_cast<double>(e.exact))
                        << " ulp; bound " << bound.ulps << " ulp + " << bound.terms_ulps
                        << " eps x " << e.magnitude << ")";
        }
      }
      ++pairs;
    }
  }
  std::printf("accuracy: %d (kernel, float dtype) pairs within their bounds\n", pairs);
}

TEST_F(AccuracyTest, CastAndFillRoundOnce) {
  std::mt19937 gen(7);
  for (DType to : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    SCOPED_TRACE(DTypeName(to));
    HostTensor x = RandomTensor(DType::kF64, {4000}, -7e4, 7e4, gen, kSigned);
    auto plan =
        Registry::Global().Prepare("cast", {x.meta}, {{"dtype", std::string(DTypeName(to))}});
    ASSERT_TRUE(plan.ok()) << plan.status();
    HostTensor y(to, x.meta.shape);
    std::vector<void*> out = {y.data()};
    ASSERT_TRUE(RunCpuKernel(*plan, {x.data()}, out, parallel_).ok());
    for (int64_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(WithinBound(BoundFor("cast", to), to, x.Get(i), y.Get(i))) << i;
    }
    auto fill = Registry::Global().Prepare("fill", {},
                                           {{"value", 1.0 / 3},
                                            {"dtype", std::string(DTypeName(to))},
                                            {"shape", std::vector<int64_t>{3}}});
    ASSERT_TRUE(fill.ok()) << fill.status();
    HostTensor f(to, {3});
    std::vector<void*> fout = {f.data()};
    ASSERT_TRUE(RunCpuKernel(*fill, {}, fout, parallel_).ok());
    EXPECT_TRUE(WithinBound(BoundFor("fill", to), to, 1.0 / 3, f.Get(0)));
  }
}

// The C-library functions of tenant-defined kernels (sin ... isfinite) on the CPU backend, over
// edge values and random ones (tests/testing/expr_math_cases.h; the CUDA path runs the same
// cases in tests/fake_cuda/user_kernels_test.cc).
TEST_F(AccuracyTest, EveryTenantKernelMathFunctionIsWithinItsDocumentedBoundOnTheCpu) {
  std::mt19937 rng(34);
  int pairs = 0;
  for (const testing::MathCase& c : testing::MathCases()) {
    for (DType d : testing::kMathDTypes) {
      SCOPED_TRACE(absl::StrCat(c.name, " ", DTypeName(d)));
      auto definition = expr::ParseSource(testing::MathCaseSource(c, d));
      ASSERT_TRUE(definition.ok()) << definition.status();
      auto kernel = expr::MakeUserKernel(*std::move(definition));
      ASSERT_TRUE(kernel.ok()) << kernel.status();
      const std::vector<HostTensor> in = testing::MathCaseInputs(c, d, rng);
      std::vector<TensorMeta> metas;
      std::vector<const void*> in_ptrs;
      for (const HostTensor& t : in) {
        metas.push_back(t.meta);
        in_ptrs.push_back(t.data());
      }
      auto plan = PrepareKernel((*kernel)->def, metas, {});
      ASSERT_TRUE(plan.ok()) << plan.status();
      plan->user = *kernel;
      HostTensor out(plan->outputs[0].dtype, plan->outputs[0].shape);
      std::vector<void*> out_ptrs = {out.data()};
      ASSERT_TRUE((*kernel)->cpu->Run(*plan, in_ptrs, out_ptrs, parallel_).ok());
      EXPECT_EQ(testing::CheckMathCase(c, d, in, out), "");
      ++pairs;
    }
  }
  std::printf("accuracy: %d (function, float dtype) pairs of tenant kernels within their bounds\n",
              pairs);
}

TEST_F(AccuracyTest, TheBoundsSayWhatTheyMean) {
  // Half an ulp allows the correctly rounded neighbour, not the next one.
  const double one_third = 1.0 / 3;
  const float rounded = static_cast<float>(one_third);
  EXPECT_TRUE(WithinBound(BoundFor("div", DType::kF32), DType::kF32, one_third, rounded));
  EXPECT_FALSE(WithinBound(BoundFor("div", DType::kF32), DType::kF32, one_third,
                           std::nextafter(rounded, 1.0f)));
  EXPECT_TRUE(WithinBound(BoundFor("exp", DType::kF32), DType::kF32, 1e300, kInf));  // overflow
  EXPECT_FALSE(WithinBound(BoundFor("exp", DType::kF32), DType::kF32, 1.0, kNan));
  EXPECT_TRUE(WithinBound(BoundFor("exp", DType::kF32), DType::kF32, kNan, kNan));
  EXPECT_TRUE(std::isnan(BoundFor("conv9d", DType::kF32).ulps));
  EXPECT_EQ(BoundFor("neg", DType::kF32).ulps, 0);
  EXPECT_EQ(BoundFor("add", DType::kI32).ulps, 0);
}

}  // namespace
}  // namespace tessera::kernels
