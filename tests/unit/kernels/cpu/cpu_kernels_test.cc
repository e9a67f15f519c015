// Every CPU kernel against straightforward double-precision references written here, over
// dtypes, broadcasting, empty and 0-d tensors, permutations and sizes large enough to be
// split across threads.
#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#include "kernels/registry.h"
#include "tests/testing/host_tensor.h"

namespace tessera::kernels {
namespace {

using testing::BroadcastSource;
using testing::HostTensor;
using testing::Unravel;

constexpr int64_t kLarge = (1 << 17) + 3;  // several chunks per worker, odd tail

const std::vector<DType> kFloats = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64};
const std::vector<DType> kSignedTypes = {DType::kF32, DType::kF16, DType::kBF16,
                                         DType::kF64, DType::kI32, DType::kI64};
const std::vector<DType> kNumericTypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                                          DType::kI32, DType::kI64, DType::kU8};

// Relative tolerance of a result rounded to `d` after computing in f32 (or f64).
double Tolerance(DType d) {
  switch (d) {
    case DType::kF64:
      return 1e-12;
    case DType::kF32:
      return 1e-5;
    case DType::kF16:
      return 2e-3;  // two ulps of a 10-bit mantissa
    case DType::kBF16:
      return 1.6e-2;  // two ulps of a 7-bit mantissa
    default:
      return 0;
  }
}

::testing::AssertionResult Near(double got, double want, DType d, double abs = 0) {
  if (std::isnan(want) && std::isnan(got)) return ::testing::AssertionSuccess();
  if (std::isinf(want) && got == want) return ::testing::AssertionSuccess();
  double tol = Tolerance(d) * std::max(std::fabs(want), 1.0) + abs;
  if (std::fabs(got - want) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", want " << want << " (" << DTypeName(d)
                                       << ", tolerance " << tol << ")";
}

class CpuKernelTest : public ::testing::Test {
 protected:
  void SetUp() override { InitCpuKernels(); }

  /// Prepares and runs `name`; outputs start as `initial` when given, else zero.
  std::vector<HostTensor> Run(const std::string& name, const std::vector<const HostTensor*>& in,
                              Attrs attrs = {}, OutputHints hints = {},
                              const HostTensor* initial = nullptr) {
    std::vector<TensorMeta> metas;
    for (const HostTensor* t : in) metas.push_back(t->meta);
    absl::StatusOr<Plan> plan = Registry::Global().Prepare(name, metas, attrs, hints);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return {};
    std::vector<HostTensor> out;
    for (const TensorMeta& m : plan->outputs) out.emplace_back(m.dtype, m.shape);
    if (initial != nullptr) out[0] = *initial;
    std::vector<const void*> in_ptrs;
    for (const HostTensor* t : in) in_ptrs.push_back(t->data());
    std::vector<void*> out_ptrs;
    for (HostTensor& t : out) out_ptrs.push_back(t.data());
    absl::Status s = RunCpuKernel(*plan, in_ptrs, out_ptrs, parallel_);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  HostTensor Random(DType d, Shape shape, double lo = -4, double hi = 4) {
    HostTensor t(d, std::move(shape));
    t.Randomize(gen_, lo, hi);
    return t;
  }

  testing::ThreadParallel parallel_{3};
  std::mt19937 gen_{1234};
};

// ---- unary ------------------------------------------------------------------------------------

struct UnaryCase {
  const char* name;
  std::function<double(double)> reference;
  std::vector<DType> dtypes;
  double lo, hi;
};

TEST_F(CpuKernelTest, UnaryKernelsMatchTheReference) {
  const std::vector<UnaryCase> cases = {
      {"neg", [](double x) { return -x; }, kSignedTypes, -4, 4},
      {"abs", [](double x) { return std::fabs(x); }, kSignedTypes, -4, 4},
      {"relu", [](double x) { return x < 0 ? 0.0 : x; }, kSignedTypes, -4, 4},
      {"exp", [](double x) { return std::exp(x); }, kFloats, -8, 8},
      {"log", [](double x) { return std::log(x); }, kFloats, 0.01, 100},
      {"sqrt", [](double x) { return std::sqrt(x); }, kFloats, 0, 100},
      {"rsqrt", [](double x) { return 1 / std::sqrt(x); }, kFloats, 0.01, 100},
      {"gelu", [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, kFloats, -6,
       6},
      {"sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, kFloats, -12, 12},
      {"tanh", [](double x) { return std::tanh(x); }, kFloats, -6, 6},
  };
  for (const UnaryCase& c : cases) {
    for (DType d : c.dtypes) {
      for (const Shape& shape : {Shape{}, Shape{0}, Shape{7}, Shape{3, 5}, Shape{kLarge}}) {
        SCOPED_TRACE(absl::StrCat(c.name, " ", DTypeName(d), ShapeString(shape)));
        HostTensor x = Random(d, shape, c.lo, c.hi);
        auto out = Run(c.name, {&x});
        ASSERT_EQ(out[0].meta, x.meta);
        for (int64_t i = 0; i < x.size(); ++i) {
          ASSERT_TRUE(Near(out[0].Get(i), c.reference(x.Get(i)), d, 1e-6)) << "at " << i;
        }
      }
    }
  }
}

TEST_F(CpuKernelTest, ScaleAndSpecialValues) {
  for (DType d : kFloats) {
    HostTensor x = Random(d, {kLarge});
    auto out = Run("scale", {&x}, {{"alpha", 2.5}, {"beta", int64_t{-1}}});
    for (int64_t i = 0; i < x.size(); i += 97) {
      ASSERT_TRUE(Near(out[0].Get(i), 2.5 * x.Get(i) - 1, d, 1e-6));
    }
  }
  HostTensor special(DType::kF32, {4});
  special.Set(0, std::nan(""));
  special.Set(1, -std::numeric_limits<double>::infinity());
  special.Set(2, -0.0);
  special.Set(3, 0);
  EXPECT_TRUE(std::isnan(Run("relu", {&special})[0].Get(0)));
  EXPECT_EQ(Run("relu", {&special})[0].Get(1), 0);
  EXPECT_EQ(Run("exp", {&special})[0].Get(1), 0);
  // Extremes of the vectorized transcendental functions, against libm.
  for (DType d : {DType::kF32, DType::kF64}) {
    HostTensor extremes(d, {8});
    const double values[] = {-1000, -100, -88.5, -30, 30, 88.5, 100, 1000};
    for (int i = 0; i < 8; ++i) extremes.Set(i, values[i]);
    auto e = Run("exp", {&extremes});
    auto sg = Run("sigmoid", {&extremes});
    auto th = Run("tanh", {&extremes});
    for (int i = 0; i < 8; ++i) {
      SCOPED_TRACE(absl::StrCat(DTypeName(d), " x=", values[i]));
      double x = values[i];
      double want_exp =
          d == DType::kF32 ? static_cast<double>(std::exp(static_cast<float>(x))) : std::exp(x);
      EXPECT_TRUE(Near(e[0].Get(i), want_exp, d, 1e-45));
      EXPECT_TRUE(Near(sg[0].Get(i), 1 / (1 + std::exp(-x)), d, 1e-30));
      EXPECT_TRUE(Near(th[0].Get(i), std::tanh(x), d));
    }
  }
  EXPECT_EQ(Run("sqrt", {&special})[0].Get(3), 0);
  EXPECT_TRUE(std::isinf(Run("rsqrt", {&special})[0].Get(3)));
  HostTensor extreme(DType::kI32, {2});
  extreme.Set(0, std::numeric_limits<int32_t>::min());
  extreme.Set(1, -7);
  auto negated = Run("neg", {&extreme});
  EXPECT_EQ(negated[0].GetInt(0), std::numeric_limits<int32_t>::min());  // wraps, no UB
  EXPECT_EQ(negated[0].GetInt(1), 7);
}

// ---- binary -----------------------------------------------------------------------------------

double BinaryReference(const std::string& op, double a, double b, DType d) {
  bool integer = !IsFloating(d);
  if (op == "add") return a + b;
  if (op == "sub") return a - b;
  if (op == "mul") return a * b;
  if (op == "div") {
    if (!integer) return a / b;
    return b == 0 ? 0 : std::trunc(a / b);
  }
  if (op == "maximum") return std::isnan(a) || a > b ? a : b;
  if (op == "minimum") return std::isnan(a) || a < b ? a : b;
  return std::pow(a, b);
}

// Integer results wrap to the dtype's width, as the kernels define.
double WrapTo(double v, DType d) {
  if (d == DType::kU8) return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(v)));
  if (d == DType::kI32) return static_cast<double>(static_cast<int32_t>(static_cast<int64_t>(v)));
  return v;
}

TEST_F(CpuKernelTest, BinaryKernelsBroadcastLikeNumPy) {
  const std::vector<std::pair<Shape, Shape>> shapes = {{{}, {}},
                                                       {{5}, {5}},
                                                       {{}, {2, 3}},
                                                       {{2, 3}, {}},
                                                       {{2, 3}, {3}},
                                                       {{3, 1, 5}, {1, 4, 5}},
                                                       {{4, 1}, {1, 6}},
                                                       {{2, 1, 3, 1}, {5, 1, 2}},
                                                       {{0, 3}, {1, 3}},
                                                       {{1}, {7}},
                                                       {{kLarge}, {kLarge}},
                                                       {{kLarge}, {1}},
                                                       {{2, 65537}, {1, 65537}},
                                                       {{65537, 2}, {65537, 1}}};
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum", "pow"}) {
    std::vector<DType> dtypes = std::string(op) == "pow" ? kFloats : kNumericTypes;
    for (DType d : dtypes) {
      for (const auto& [sa, sb] : shapes) {
        SCOPED_TRACE(absl::StrCat(op, " ", DTypeName(d), ShapeString(sa), ShapeString(sb)));
        bool positive = std::string(op) == "pow";
        HostTensor a = Random(d, sa, positive ? 0.1 : -4, 4);
        HostTensor b = Random(d, sb, positive ? -2 : -4, positive ? 2 : 4);
        auto out = Run(op, {&a, &b});
        Shape expected_shape = *BroadcastShapes(sa, sb);
        ASSERT_EQ(out[0].meta.shape, expected_shape);
        int64_t step = out[0].size() > 10000 ? 101 : 1;
        for (int64_t i = 0; i < out[0].size(); i += step) {
          std::vector<int64_t> index = Unravel(i, expected_shape);
          double va = a.Get(BroadcastSource(index, sa));
          double vb = b.Get(BroadcastSource(index, sb));
          double want = WrapTo(BinaryReference(op, va, vb, d), d);
          if (IsFloating(d)) {
            ASSERT_TRUE(Near(out[0].Get(i), want, d, 1e-6)) << "at " << i;
          } else {
            ASSERT_EQ(out[0].Get(i), want) << "at " << i << ": " << va << " " << vb;
          }
        }
      }
    }
  }
}

TEST_F(CpuKernelTest, IntegerDivisionEdgesAreDefined) {
  HostTensor a(DType::kI32, {4}), b(DType::kI32, {4});
  a.Set(0, 7), b.Set(0, 0);                                     // x / 0 = 0
  a.Set(1, std::numeric_limits<int32_t>::min()), b.Set(1, -1);  // would trap in C++
  a.Set(2, -7), b.Set(2, 2);                                    // truncates toward zero
  a.Set(3, std::numeric_limits<int32_t>::max()), b.Set(3, 1);
  auto out = Run("div", {&a, &b});
  EXPECT_EQ(out[0].GetInt(0), 0);
  EXPECT_EQ(out[0].GetInt(1), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(out[0].GetInt(2), -3);
  EXPECT_EQ(out[0].GetInt(3), std::numeric_limits<int32_t>::max());
  HostTensor big(DType::kI64, {1}), two(DType::kI64, {1});
  const int64_t max = std::numeric_limits<int64_t>::max();
  std::memcpy(big.data(), &max, sizeof(max));
  two.Set(0, 2);
  EXPECT_EQ(Run("add", {&big, &big})[0].GetInt(0), -2);  // wraps, no UB
  EXPECT_EQ(Run("mul", {&big, &two})[0].GetInt(0), -2);
}

TEST_F(CpuKernelTest, NanPropagatesThroughMaximumAndMinimum) {
  HostTensor a(DType::kF32, {2}), b(DType::kF32, {2});
  a.Set(0, std::nan("")), b.Set(0, 1);
  a.Set(1, 1), b.Set(1, std::nan(""));
  for (const char* op : {"maximum", "minimum"}) {
    auto out = Run(op, {&a, &b});
    EXPECT_TRUE(std::isnan(out[0].Get(0))) << op;
    EXPECT_TRUE(std::isnan(out[0].Get(1))) << op;
  }
}

// ---- fill, copy, cast -------------------------------------------------------------------------

TEST_F(CpuKernelTest, FillEveryDtype) {
  for (DType d : kAllDTypes) {
    auto out = Run("fill", {},
                   {{"value", 3.0},
                    {"dtype", std::string(DTypeName(d))},
                    {"shape", std::vector<int64_t>{kLarge}}});
    ASSERT_EQ(out[0].meta, (TensorMeta{d, {kLarge}}));
    for (int64_t i = 0; i < kLarge; i += 1001) ASSERT_EQ(out[0].Get(i), d == DType::kBool ? 1 : 3);
  }
  // The output's own type and shape when given as a hint; a scalar.
  auto hinted = Run("fill", {}, {{"value", -1.5}}, {TensorMeta{DType::kF16, {}}});
  EXPECT_EQ(hinted[0].meta, (TensorMeta{DType::kF16, {}}));
  EXPECT_EQ(hinted[0].Get(0), -1.5);
  auto saturated =
      Run("fill", {},
          {{"value", 300.0}, {"dtype", std::string("u8")}, {"shape", std::vector<int64_t>{2}}});
  EXPECT_EQ(saturated[0].Get(0), 255);
}

TEST_F(CpuKernelTest, CopyEveryDtypeAndSize) {
  for (DType d : kAllDTypes) {
    for (const Shape& shape : {Shape{}, Shape{0}, Shape{3, 4}, Shape{kLarge}}) {
      HostTensor x = Random(d, shape);
      auto out = Run("copy", {&x});
      EXPECT_EQ(out[0].bytes, x.bytes) << DTypeName(d) << ShapeString(shape);
    }
  }
}

double CastReference(double v, DType to) {
  switch (to) {
    case DType::kBool:
      return v != 0 || std::isnan(v) ? 1 : 0;
    case DType::kU8:
    case DType::kI32:
    case DType::kI64: {
      if (std::isnan(v)) return 0;
      double lo = to == DType::kU8 ? 0 : to == DType::kI32 ? -2147483648.0 : -9223372036854775808.0;
      double hi = to == DType::kU8 ? 255 : to == DType::kI32 ? 2147483647.0 : 9223372036854775807.0;
      return std::clamp(std::trunc(v), lo, hi);
    }
    default:
      return v;  // rounded by HostTensor's Set in the comparison below
  }
}

TEST_F(CpuKernelTest, CastEveryPairWithSaturation) {
  const std::vector<double> values = {0,
                                      1,
                                      -1,
                                      3.7,
                                      -3.7,
                                      255.5,
                                      256,
                                      -0.5,
                                      1e10,
                                      -1e10,
                                      65504,
                                      1e-8,
                                      0.1,
                                      std::nan(""),
                                      std::numeric_limits<double>::infinity(),
                                      -std::numeric_limits<double>::infinity()};
  for (DType from : kAllDTypes) {
    HostTensor x(from, {static_cast<int64_t>(values.size())});
    for (size_t i = 0; i < values.size(); ++i) {
      double v = values[i];
      if (!IsFloating(from)) v = CastReference(v, from);  // what an int tensor can hold
      x.Set(static_cast<int64_t>(i), v);
    }
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(from), " -> ", DTypeName(to)));
      auto out = Run("cast", {&x}, {{"dtype", std::string(DTypeName(to))}});
      HostTensor expected(to, x.meta.shape);  // floats: the reference rounded once
      for (int64_t i = 0; i < x.size(); ++i) {
        double want = CastReference(x.Get(i), to);
        if (!IsFloating(to)) {
          int64_t want_int = want >= 9.2e18    ? std::numeric_limits<int64_t>::max()
                             : want <= -9.2e18 ? std::numeric_limits<int64_t>::min()
                                               : static_cast<int64_t>(want);
          EXPECT_EQ(out[0].GetInt(i), want_int) << "at " << i << " from " << x.Get(i);
          continue;
        }
        expected.Set(i, want);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(out[0].Get(i))) << "at " << i;
        } else {
          EXPECT_EQ(out[0].Get(i), expected.Get(i)) << "at " << i << " from " << x.Get(i);
        }
      }
    }
  }
}

// ---- reductions -------------------------------------------------------------------------------

struct ReduceRef {
  Shape shape;
  std::vector<std::vector<double>> groups;  // the input values feeding each output
};

ReduceRef GroupForReduction(const HostTensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  const Shape& shape = x.meta.shape;
  std::vector<bool> reduced(shape.size(), axes.empty());
  for (int64_t a : axes) reduced[a < 0 ? a + static_cast<int64_t>(shape.size()) : a] = true;
  ReduceRef r;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d])
      r.shape.push_back(shape[d]);
    else if (keepdims)
      r.shape.push_back(1);
  }
  Shape kept;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d]) kept.push_back(shape[d]);
  }
  r.groups.resize(static_cast<size_t>(CheckedNumElements(kept)));
  if (!r.groups.empty()) {
    for (auto& g : r.groups) g.reserve(static_cast<size_t>(x.size()) / r.groups.size());
  }
  // The index of element i, advanced as an odometer (the last axis fastest).
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t i = 0; i < x.size(); ++i) {
    int64_t o = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (!reduced[d]) o = o * shape[d] + index[d];
    }
    r.groups[o].push_back(x.Get(i));
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return r;
}

TEST_F(CpuKernelTest, ReductionsOverAxes) {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {{{}, {}},
                                                                     {{5}, {}},
                                                                     {{5}, {0}},
                                                                     {{3, 4, 5}, {}},
                                                                     {{3, 4, 5}, {0}},
                                                                     {{3, 4, 5}, {-1}},
                                                                     {{3, 4, 5}, {0, 2}},
                                                                     {{3, 4, 5}, {1}},
                                                                     {{2, 1, 3}, {1}},
                                                                     {{2, 0, 3}, {0}},
                                                                     {{kLarge}, {}},
                                                                     {{2, kLarge}, {1}},
                                                                     {{kLarge, 2}, {0}},
                                                                     {{4, 3, 2, 5}, {1, 3}}};
  // One input and one reference grouping per (dtype, case, keepdims), checked by every op.
  for (DType d : kNumericTypes) {
    for (const auto& [shape, axes] : cases) {
      for (bool keepdims : {false, true}) {
        HostTensor x = Random(d, shape);
        ReduceRef ref = GroupForReduction(x, axes, keepdims);
        bool empty_group = !ref.groups.empty() && ref.groups[0].empty();
        for (const std::string op : {"sum", "mean", "max", "min"}) {
          if (op == "mean" && !IsFloating(d)) continue;
          if ((op == "max" || op == "min") && empty_group) continue;
          SCOPED_TRACE(absl::StrCat(op, " ", DTypeName(d), ShapeString(shape), " axes ",
                                    ShapeString(axes), keepdims ? " keepdims" : ""));
          auto out = Run(op, {&x}, {{"axes", axes}, {"keepdims", keepdims}});
          ASSERT_EQ(out[0].meta.shape, ref.shape);
          DType want_type = op == "sum" && !IsFloating(d) ? DType::kI64 : d;
          ASSERT_EQ(out[0].meta.dtype, want_type);
          for (size_t o = 0; o < ref.groups.size(); ++o) {
            const std::vector<double>& g = ref.groups[o];
            double want;
            if (op == "sum" || op == "mean") {
              want = std::accumulate(g.begin(), g.end(), 0.0);
              if (op == "mean") want = g.empty() ? std::nan("") : want / g.size();
            } else if (op == "max") {
              want = *std::max_element(g.begin(), g.end());
            } else {
              want = *std::min_element(g.begin(), g.end());
            }
            // Sums of many rounded terms: tolerance grows with sqrt(n) for f16/bf16 (the
            // accumulation itself is in f64).
            double abs = IsFloating(d) ? 1e-6 * std::sqrt(static_cast<double>(g.size())) * 4 : 0;
            if (IsFloating(want_type)) {
              ASSERT_TRUE(Near(out[0].Get(static_cast<int64_t>(o)), want, want_type, abs));
            } else {
              ASSERT_EQ(out[0].Get(static_cast<int64_t>(o)), want);
            }
          }
        }
      }
    }
  }
}

TEST_F(CpuKernelTest, ReductionsOfNanAndEmptyAxes) {
  HostTensor x(DType::kF32, {3});
  x.Set(0, 1), x.Set(1, std::nan("")), x.Set(2, 5);
  EXPECT_TRUE(std::isnan(Run("max", {&x})[0].Get(0)));
  EXPECT_TRUE(std::isnan(Run("min", {&x})[0].Get(0)));
  EXPECT_TRUE(std::isnan(Run("sum", {&x})[0].Get(0)));
  HostTensor empty(DType::kF32, {0});
  EXPECT_EQ(Run("sum", {&empty})[0].Get(0), 0);
  EXPECT_TRUE(std::isnan(Run("mean", {&empty})[0].Get(0)));
  absl::Status refused = Registry::Global().Prepare("max", {empty.meta}, {}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuKernelTest, ArgmaxFirstMaximumAlongAxis) {
  for (DType d : kNumericTypes) {
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, int64_t>>{
             {{7}, 0}, {{3, 4, 5}, -1}, {{3, 4, 5}, 1}, {{3, 4, 5}, 0}, {{2, kLarge}, 1}}) {
      for (bool keepdims : {false, true}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(d), ShapeString(shape), " axis ", axis));
        HostTensor x = Random(d, shape, -3, 3);  // small range: many ties
        auto out = Run("argmax", {&x}, {{"axis", axis}, {"keepdims", keepdims}});
        int a = static_cast<int>(axis < 0 ? axis + static_cast<int64_t>(shape.size()) : axis);
        ReduceRef ref = GroupForReduction(x, {a}, keepdims);
        ASSERT_EQ(out[0].meta, (TensorMeta{DType::kI64, ref.shape}));
        for (size_t o = 0; o < ref.groups.size(); ++o) {
          const auto& g = ref.groups[o];
          int64_t want = std::max_element(g.begin(), g.end()) - g.begin();  // first maximum
          ASSERT_EQ(out[0].GetInt(static_cast<int64_t>(o)), want);
        }
      }
    }
  }
  HostTensor scalar(DType::kF32, {});
  EXPECT_EQ(Run("argmax", {&scalar})[0].GetInt(0), 0);
  HostTensor with_nan(DType::kF64, {4});
  with_nan.Set(0, 1), with_nan.Set(1, 9), with_nan.Set(2, std::nan("")), with_nan.Set(3, 10);
  EXPECT_EQ(Run("argmax", {&with_nan})[0].GetInt(0), 2);
}

// ---- softmax, norms ---------------------------------------------------------------------------

TEST_F(CpuKernelTest, SoftmaxAndLogSoftmaxAlongAnyAxis) {
  for (DType d : kFloats) {
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, int64_t>>{{{}, -1},
                                                                            {{6}, 0},
                                                                            {{3, 4, 5}, -1},
                                                                            {{3, 4, 5}, 1},
                                                                            {{3, 4, 5}, 0},
                                                                            {{0, 4}, 1},
                                                                            {{16, 512}, -1}}) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(absl::StrCat(log ? "log_" : "", "softmax ", DTypeName(d), ShapeString(shape),
                                  " axis ", axis));
        HostTensor x = Random(d, shape, -10, 10);
        auto out = Run(log ? "log_softmax" : "softmax", {&x}, {{"axis", axis}});
        ASSERT_EQ(out[0].meta, x.meta);
        int a = shape.empty() ? 0 : static_cast<int>(axis < 0 ? axis + shape.size() : axis);
        // Element i's row along the axis: `length` elements `stride` apart from `first`.
        const int64_t length = shape.empty() ? 1 : shape[a];
        int64_t stride = 1;
        for (size_t dd = static_cast<size_t>(a) + 1; dd < shape.size(); ++dd) stride *= shape[dd];
        // Each row's max and sum of exponentials, computed once, by its first element.
        std::vector<std::pair<double, double>> rows(static_cast<size_t>(x.size()));
        std::vector<bool> done(static_cast<size_t>(x.size()), false);
        for (int64_t i = 0; i < x.size(); ++i) {
          const int64_t first = i - (i / stride) % length * stride;
          if (!done[first]) {
            double max = -INFINITY, sum = 0;
            for (int64_t k = 0; k < length; ++k) max = std::max(max, x.Get(first + k * stride));
            for (int64_t k = 0; k < length; ++k) sum += std::exp(x.Get(first + k * stride) - max);
            rows[first] = {max, sum};
            done[first] = true;
          }
          const auto [max, sum] = rows[first];
          double want = log ? x.Get(i) - max - std::log(sum) : std::exp(x.Get(i) - max) / sum;
          ASSERT_TRUE(Near(out[0].Get(i), want, d, 1e-6)) << "at " << i;
        }
      }
    }
  }
}

TEST_F(CpuKernelTest, LayerNormAndRmsNorm) {
  for (DType d : kFloats) {
    for (const Shape& shape : {Shape{}, Shape{5}, Shape{3, 8}, Shape{2, 3, 16}, Shape{512, 257}}) {
      for (int extra : {0, 1, 2}) {
        for (bool rms : {false, true}) {
          if (rms && extra == 2) continue;
          SCOPED_TRACE(absl::StrCat(rms ? "rms_norm " : "layer_norm ", DTypeName(d),
                                    ShapeString(shape), " with ", extra, " params"));
          int64_t width = shape.empty() ? 1 : shape.back();
          HostTensor x = Random(d, shape, -3, 5);
          HostTensor w = Random(d, {width}, 0.5, 2);
          HostTensor b = Random(d, {width}, -1, 1);
          std::vector<const HostTensor*> in = {&x};
          if (extra >= 1) in.push_back(&w);
          if (extra >= 2) in.push_back(&b);
          double eps = rms ? 1e-6 : 1e-5;
          auto out = Run(rms ? "rms_norm" : "layer_norm", in);
          ASSERT_EQ(out[0].meta, x.meta);
          for (int64_t r = 0; r * width < x.size(); ++r) {
            double mean = 0, sq = 0;
            for (int64_t k = 0; k < width; ++k) mean += x.Get(r * width + k);
            mean = rms ? 0 : mean / width;
            for (int64_t k = 0; k < width; ++k) sq += std::pow(x.Get(r * width + k) - mean, 2);
            double inv = 1 / std::sqrt(sq / width + eps);
            for (int64_t k = 0; k < width; ++k) {
              double want = (x.Get(r * width + k) - mean) * inv;
              if (extra >= 1) want *= w.Get(k);
              if (extra >= 2) want += b.Get(k);
              ASSERT_TRUE(Near(out[0].Get(r * width + k), want, d, 1e-5));
            }
          }
        }
      }
    }
  }
}

// ---- transpose --------------------------------------------------------------------------------

TEST_F(CpuKernelTest, TransposeEveryPermutation) {
  for (DType d : {DType::kF32, DType::kF16, DType::kF64, DType::kU8, DType::kI64}) {
    for (const Shape& shape : {Shape{2, 3, 4}, Shape{2, 1, 3, 2}, Shape{3, 0, 2}}) {
      std::vector<int64_t> perm(shape.size());
      std::iota(perm.begin(), perm.end(), 0);
      do {
        SCOPED_TRACE(absl::StrCat(DTypeName(d), ShapeString(shape), " perm ", ShapeString(perm)));
        HostTensor x = Random(d, shape);
        auto out = Run("transpose", {&x}, {{"perm", perm}});
        Shape out_shape;
        for (int64_t p : perm) out_shape.push_back(shape[p]);
        ASSERT_EQ(out[0].meta.shape, out_shape);
        for (int64_t i = 0; i < out[0].size(); ++i) {
          std::vector<int64_t> oi = Unravel(i, out_shape);
          std::vector<int64_t> xi(shape.size());
          for (size_t k = 0; k < perm.size(); ++k) xi[perm[k]] = oi[k];
          int64_t linear = 0;
          for (size_t k = 0; k < shape.size(); ++k) linear = linear * shape[k] + xi[k];
          ASSERT_EQ(out[0].Get(i), x.Get(linear));
        }
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
  }
  HostTensor m = Random(DType::kF32, {513, 300});
  auto t = Run("transpose", {&m});  // default: reversed axes
  ASSERT_EQ(t[0].meta.shape, (Shape{300, 513}));
  EXPECT_EQ(t[0].Get(299 * 513 + 512), m.Get(512 * 300 + 299));
  HostTensor s = Random(DType::kF32, {});
  EXPECT_EQ(Run("transpose", {&s})[0].Get(0), s.Get(0));
}

TEST_F(CpuKernelTest, ElementwiseOnPermutedInputs) {
  // A non-contiguous view made contiguous by transpose, then combined with broadcasting.
  HostTensor x = Random(DType::kF32, {4, 6, 5});
  auto xt = Run("transpose", {&x}, {{"perm", std::vector<int64_t>{2, 0, 1}}});
  HostTensor row = Random(DType::kF32, {6});
  auto sum = Run("add", {&xt[0], &row});
  ASSERT_EQ(sum[0].meta.shape, (Shape{5, 4, 6}));
  for (int64_t i = 0; i < sum[0].size(); ++i) {
    std::vector<int64_t> o = Unravel(i, {5, 4, 6});
    double want = x.Get((o[1] * 6 + o[2]) * 5 + o[0]) + row.Get(o[2]);
    ASSERT_TRUE(Near(sum[0].Get(i), want, DType::kF32));
  }
}

// ---- matmul -----------------------------------------------------------------------------------

TEST_F(CpuKernelTest, MatmulBatchedTransposedScaled) {
  struct Case {
    Shape a, b;
    bool ta, tb;
    double alpha, beta;
  };
  const std::vector<Case> cases = {
      {{3, 4}, {4, 5}, false, false, 1, 0},          {{4, 3}, {4, 5}, true, false, 1, 0},
      {{3, 4}, {5, 4}, false, true, 2, 0},           {{4, 3}, {5, 4}, true, true, 1, 0.5},
      {{2, 1, 3, 4}, {5, 4, 6}, false, false, 1, 0}, {{1, 7}, {7, 1}, false, false, 1, 0},
      {{3, 0}, {0, 4}, false, false, 1, 0.5},        {{0, 4}, {4, 3}, false, false, 1, 0},
      {{130, 257}, {257, 65}, false, false, 1, 0},   {{257, 130}, {65, 257}, true, true, -1, 1},
      {{6, 33, 17}, {17, 9}, false, false, 1, 0}};
  for (DType d : kFloats) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(DTypeName(d), " ", ShapeString(c.a), "@", ShapeString(c.b),
                                " ta=", c.ta, " tb=", c.tb, " beta=", c.beta));
      HostTensor a = Random(d, c.a, -1, 1);
      HostTensor b = Random(d, c.b, -1, 1);
      Attrs attrs = {
          {"transpose_a", c.ta}, {"transpose_b", c.tb}, {"alpha", c.alpha}, {"beta", c.beta}};
      std::vector<TensorMeta> metas = {a.meta, b.meta};
      auto plan = Registry::Global().Prepare("matmul", metas, attrs);
      ASSERT_TRUE(plan.ok()) << plan.status();
      HostTensor initial = Random(d, plan->outputs[0].shape, -1, 1);
      auto out = Run("matmul", {&a, &b}, attrs, {}, &initial);
      const Shape& ys = out[0].meta.shape;
      const int64_t m = ys[ys.size() - 2], n = ys[ys.size() - 1];
      const int64_t k = c.ta ? c.a[c.a.size() - 2] : c.a.back();
      Shape batch(ys.begin(), ys.end() - 2);
      for (int64_t i = 0; i < out[0].size(); ++i) {
        std::vector<int64_t> yi = Unravel(i, ys);
        std::vector<int64_t> bi(yi.begin(), yi.end() - 2);
        int64_t row = yi[yi.size() - 2], col = yi.back();
        Shape a_batch(c.a.begin(), c.a.end() - 2), b_batch(c.b.begin(), c.b.end() - 2);
        int64_t ab = BroadcastSource(bi, a_batch), bb = BroadcastSource(bi, b_batch);
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) {
          int64_t ar = c.a[c.a.size() - 2], ac = c.a.back();
          int64_t br = c.b[c.b.size() - 2], bc = c.b.back();
          double av =
              c.ta ? a.Get(ab * ar * ac + p * ac + row) : a.Get(ab * ar * ac + row * ac + p);
          double bv =
              c.tb ? b.Get(bb * br * bc + col * bc + p) : b.Get(bb * br * bc + p * bc + col);
          acc += av * bv;
        }
        double want = c.alpha * acc + c.beta * initial.Get(i);
        ASSERT_TRUE(Near(out[0].Get(i), want, d, 1e-5 * std::sqrt(static_cast<double>(k) + 1)))
            << "at " << i << " (m=" << m << ", n=" << n << ")";
      }
    }
  }
}

TEST_F(CpuKernelTest, EveryCatalogKernelHasACpuImplementation) {
  for (const KernelDef& k : Registry::Global().kernels()) {
    std::vector<TensorMeta> in;
    for (const ParamDef& p : k.inputs) {
      if (p.optional) continue;
      in.push_back({p.dtypes[0], k.name == "matmul" ? Shape{2, 2} : Shape{2}});
    }
    Attrs attrs;
    if (k.name == "cast") attrs["dtype"] = std::string("f64");
    if (k.name == "fill") attrs["shape"] = std::vector<int64_t>{2};
    auto plan = Registry::Global().Prepare(k.name, in, attrs);
    ASSERT_TRUE(plan.ok()) << k.name << ": " << plan.status();
    std::vector<HostTensor> inputs, outputs;
    std::vector<const void*> ip;
    std::vector<void*> op;
    for (const TensorMeta& m : plan->inputs) inputs.emplace_back(m.dtype, m.shape);
    for (const TensorMeta& m : plan->outputs) outputs.emplace_back(m.dtype, m.shape);
    for (auto& t : inputs) ip.push_back(t.data());
    for (auto& t : outputs) op.push_back(t.data());
    EXPECT_TRUE(RunCpuKernel(*plan, ip, op, parallel_).ok()) << k.name;
  }
}

}  // namespace
}  // namespace tessera::kernels
