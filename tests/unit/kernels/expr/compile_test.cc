#include "kernels/expr/compile.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "kernels/expr/names.h"
#include "kernels/shape.h"

namespace tessera::kernels::expr {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---- Helpers ------------------------------------------------------------------------------

OperandDef Op(std::string name, DType dtype = DType::kF32, int rank = -1) {
  return OperandDef{std::move(name), dtype, rank};
}
ScalarDef Float(std::string name, std::optional<double> value = std::nullopt) {
  return ScalarDef{std::move(name), ScalarKind::kFloat, value};
}
ScalarDef Int(std::string name, std::optional<double> value = std::nullopt) {
  return ScalarDef{std::move(name), ScalarKind::kInt, value};
}

// The usual signature: x, w: f32; i: i32; d: f64; m: bool; parameters alpha (float), n (int).
Definition Def(std::string body, std::vector<OperandDef> outputs = {Op("y")}) {
  Definition d;
  d.name = "k";
  d.inputs = {Op("x"), Op("w"), Op("i", DType::kI32), Op("d", DType::kF64), Op("m", DType::kBool)};
  d.outputs = std::move(outputs);
  d.params = {Float("alpha", 1.5), Int("n", 3)};
  d.body = std::move(body);
  return d;
}

using kernels::expr::internal::IsFloat;
using kernels::expr::internal::TypeName;

// Func's names, in its order.
constexpr const char* kFunctionNames[] = {
    "abs",    "exp",    "log",     "sqrt",     "rsqrt",   "relu",    "gelu",    "sigmoid",
    "tanh",   "pow",    "maximum", "minimum",  "sin",     "cos",     "tan",     "arcsin",
    "arccos", "arctan", "sinh",    "cosh",     "arcsinh", "arccosh", "arctanh", "log10",
    "log2",   "log1p",  "exp2",    "expm1",    "cbrt",    "ceil",    "floor",   "trunc",
    "round",  "isnan",  "isinf",   "isfinite", "arctan2", "hypot",   "copysign"};
static_assert(std::size(kFunctionNames) == static_cast<size_t>(kLastFunc) + 1);

// A node and what it uses as an S-expression: operands by name, constants with a type
// suffix (2 for i64, 2f for f32, 2d for f64), operations as (op:type args...).
std::string Render(const Program& p, int32_t index) {
  const Node& n = p.nodes[index];
  auto args = [&] {
    std::vector<std::string> parts;
    for (int32_t a : n.args) parts.push_back(Render(p, a));
    return absl::StrJoin(parts, " ");
  };
  switch (n.kind) {
    case NodeKind::kInput:
      return p.definition.inputs[n.index].name;
    case NodeKind::kParam:
      return p.definition.params[n.index].name;
    case NodeKind::kConst:
      switch (n.type) {
        case Type::kBool:
          return n.i != 0 ? "true" : "false";
        case Type::kI64:
          return absl::StrCat(n.i);
        case Type::kF32:
          return absl::StrCat(n.f, "f");
        case Type::kF64:
          return absl::StrCat(n.f, "d");
      }
      return "?";
    case NodeKind::kUnary: {
      static const char* kNames[] = {"neg", "not", "~"};
      return absl::StrCat("(", kNames[n.op], ":", TypeName(n.type), " ", args(), ")");
    }
    case NodeKind::kBinary: {
      static const char* kNames[] = {"+",  "-",  "*",  "/",  "%", "<", "<=", ">",  ">=",
                                     "==", "!=", "&&", "||", "&", "|", "^",  "<<", ">>"};
      return absl::StrCat("(", kNames[n.op], ":", TypeName(n.type), " ", args(), ")");
    }
    case NodeKind::kCall:
      return absl::StrCat("(", kFunctionNames[n.op], ":", TypeName(n.type), " ", args(), ")");
    case NodeKind::kWhere:
      return absl::StrCat("(where:", TypeName(n.type), " ", args(), ")");
    case NodeKind::kCast:
      return absl::StrCat("(cast:", TypeName(n.type), " ", args(), ")");
    case NodeKind::kReduced:
      return absl::StrCat("reduced:", TypeName(n.type));
    case NodeKind::kCount:
      return "count";
  }
  return "?";
}

std::string Result(const Program& p, size_t output = 0) { return Render(p, p.results.at(output)); }

// The contract of ast.h and docs/kernels.md ("The checked program"), node by node.
void ExpectWellFormed(const Program& p) {
  const Definition& d = p.definition;
  ASSERT_EQ(p.results.size(), d.outputs.size());
  ASSERT_LE(p.nodes.size(), kMaxNodes);
  ASSERT_EQ(p.hash.size(), 64u);
  const int64_t map = p.reduction.has_value() ? p.reduction->map : -1;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const Node& n = p.nodes[i];
    SCOPED_TRACE(absl::StrCat("node ", i, ": ", Render(p, static_cast<int32_t>(i))));
    for (int32_t a : n.args) ASSERT_TRUE(a >= 0 && a < static_cast<int32_t>(i));
    auto arg = [&](size_t k) { return p.nodes[n.args.at(k)].type; };
    const bool post = p.reduction.has_value() && static_cast<int64_t>(i) > map;
    switch (n.kind) {
      case NodeKind::kInput:
        EXPECT_FALSE(post) << "an input after the reduction";
        ASSERT_LT(n.index, static_cast<int32_t>(d.inputs.size()));
        EXPECT_EQ(n.type, ComputeType(d.inputs[n.index].dtype));
        EXPECT_TRUE(n.args.empty());
        break;
      case NodeKind::kParam:
        ASSERT_LT(n.index, static_cast<int32_t>(d.params.size()));
        EXPECT_EQ(n.type, d.params[n.index].kind == ScalarKind::kInt ? Type::kI64 : Type::kF64);
        EXPECT_TRUE(n.args.empty());
        break;
      case NodeKind::kConst:
        EXPECT_TRUE(n.args.empty());
        if (n.type == Type::kF32 && std::isfinite(n.f)) {
          EXPECT_EQ(n.f, static_cast<double>(static_cast<float>(n.f))) << "not an f32 value";
        }
        if (n.type == Type::kBool) {
          EXPECT_TRUE(n.i == 0 || n.i == 1);
        }
        break;
      case NodeKind::kUnary:
        ASSERT_EQ(n.args.size(), 1u);
        EXPECT_EQ(arg(0), n.type);
        EXPECT_EQ(n.type == Type::kBool, n.op == static_cast<uint8_t>(UnaryOp::kNot));
        if (n.op == static_cast<uint8_t>(UnaryOp::kBitNot)) {
          EXPECT_EQ(n.type, Type::kI64);
        }
        break;
      case NodeKind::kBinary: {
        ASSERT_EQ(n.args.size(), 2u);
        EXPECT_EQ(arg(0), arg(1));
        auto op = static_cast<BinaryOp>(n.op);
        ASSERT_LE(n.op, static_cast<uint8_t>(BinaryOp::kShr));
        if (op >= BinaryOp::kBitAnd) {
          EXPECT_EQ(n.type, Type::kI64);
          EXPECT_EQ(arg(0), Type::kI64);
        } else if (op <= BinaryOp::kMod) {
          EXPECT_EQ(arg(0), n.type);
          EXPECT_NE(n.type, Type::kBool);
        } else if (op <= BinaryOp::kGe) {
          EXPECT_EQ(n.type, Type::kBool);
          EXPECT_NE(arg(0), Type::kBool);
        } else if (op <= BinaryOp::kNe) {
          EXPECT_EQ(n.type, Type::kBool);
        } else {
          EXPECT_EQ(n.type, Type::kBool);
          EXPECT_EQ(arg(0), Type::kBool);
        }
        break;
      }
      case NodeKind::kCall: {
        auto f = static_cast<Func>(n.op);
        ASSERT_LE(n.op, static_cast<uint8_t>(kLastFunc));
        ASSERT_EQ(n.args.size(), static_cast<size_t>(FuncArity(f)));
        if (IsPredicate(f)) {
          EXPECT_EQ(n.type, Type::kBool);
          EXPECT_TRUE(IsFloat(arg(0)));
          break;
        }
        for (size_t k = 0; k < n.args.size(); ++k) EXPECT_EQ(arg(k), n.type);
        if (f == Func::kAbs || f == Func::kMaximum || f == Func::kMinimum) {
          EXPECT_NE(n.type, Type::kBool);
        } else {
          EXPECT_TRUE(IsFloat(n.type));
        }
        break;
      }
      case NodeKind::kWhere:
        ASSERT_EQ(n.args.size(), 3u);
        EXPECT_EQ(arg(0), Type::kBool);
        EXPECT_EQ(arg(1), n.type);
        EXPECT_EQ(arg(2), n.type);
        break;
      case NodeKind::kCast:
        ASSERT_EQ(n.args.size(), 1u);
        EXPECT_NE(arg(0), n.type);
        break;
      case NodeKind::kReduced:
        ASSERT_TRUE(p.reduction.has_value());
        EXPECT_EQ(static_cast<int64_t>(i), map + 1);
        EXPECT_TRUE(n.args.empty());
        break;
      case NodeKind::kCount:
        EXPECT_TRUE(post) << "count outside a post-expression";
        EXPECT_EQ(n.type, Type::kI64);
        break;
    }
  }
  for (size_t o = 0; o < p.results.size(); ++o) {
    ASSERT_TRUE(p.results[o] >= 0 && p.results[o] < static_cast<int32_t>(p.nodes.size()));
    // Store rules: floats only into float outputs, bools only into bool outputs.
    Type t = p.nodes[p.results[o]].type;
    DType out = d.outputs[o].dtype;
    EXPECT_EQ(t == Type::kBool, out == DType::kBool);
    if (IsFloat(t)) {
      EXPECT_TRUE(IsFloating(out));
    }
  }
  if (p.reduction.has_value()) {
    ASSERT_EQ(p.results.size(), 1u);
    ASSERT_LT(map + 1, static_cast<int64_t>(p.nodes.size()));
    EXPECT_EQ(p.nodes[map + 1].kind, NodeKind::kReduced);
    // nodes[0..map] are exactly the map's subgraph.
    std::vector<bool> used(map + 1, false);
    used[map] = true;
    for (int64_t i = map; i >= 0; --i) {
      if (!used[i]) continue;
      for (int32_t a : p.nodes[i].args) used[a] = true;
    }
    for (int64_t i = 0; i <= map; ++i) EXPECT_TRUE(used[i]) << "node " << i << " not in the map";
    const Combine c = p.reduction->combine;
    const Type map_type = p.nodes[map].type;
    EXPECT_NE(map_type, Type::kBool);
    if (c == Combine::kArgmin || c == Combine::kArgmax) {
      EXPECT_EQ(p.reduction->accumulate, Type::kI64);
      EXPECT_EQ(p.nodes[map + 1].type, Type::kI64);
    } else {
      EXPECT_EQ(p.reduction->accumulate, map_type);
      EXPECT_EQ(p.nodes[map + 1].type, map_type);
    }
  } else {
    for (const Node& n : p.nodes) {
      EXPECT_NE(n.kind, NodeKind::kReduced);
      EXPECT_NE(n.kind, NodeKind::kCount);
    }
  }
}

Program Ok(const Definition& d) {
  absl::StatusOr<Program> p = Compile(d);
  EXPECT_TRUE(p.ok()) << p.status() << "\nbody:\n" << d.body;
  if (!p.ok()) return Program{};
  ExpectWellFormed(*p);
  return *std::move(p);
}

Program Ok(std::string body, std::vector<OperandDef> outputs = {Op("y")}) {
  return Ok(Def(std::move(body), std::move(outputs)));
}

std::string Error(const Definition& d) {
  absl::StatusOr<Program> p = Compile(d);
  EXPECT_FALSE(p.ok()) << "compiled:\n" << d.body;
  if (p.ok()) return "";
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  return std::string(p.status().message());
}

std::string Error(std::string body, std::vector<OperandDef> outputs = {Op("y")}) {
  return Error(Def(std::move(body), std::move(outputs)));
}

int Count(const Program& p, NodeKind kind) {
  int n = 0;
  for (const Node& node : p.nodes) n += node.kind == kind;
  return n;
}

void ExpectSameDefinition(const Definition& a, const Definition& b) {
  EXPECT_EQ(a.name, b.name);
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  ASSERT_EQ(a.params.size(), b.params.size());
  auto same_operands = [](const std::vector<OperandDef>& x, const std::vector<OperandDef>& y) {
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].name, y[i].name);
      EXPECT_EQ(x[i].dtype, y[i].dtype);
      EXPECT_EQ(x[i].rank, y[i].rank);
    }
  };
  same_operands(a.inputs, b.inputs);
  same_operands(a.outputs, b.outputs);
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].name, b.params[i].name);
    EXPECT_EQ(a.params[i].kind, b.params[i].kind);
    EXPECT_EQ(a.params[i].default_value, b.params[i].default_value);
  }
  EXPECT_EQ(a.body, b.body);
}

// ---- Elementwise programs: structure, types, casts -----------------------------------------

TEST(CompileTest, SwishIsOneLoadAndFourNodes) {
  Program p = Ok("y = x * sigmoid(1.702 * x)");
  EXPECT_EQ(Result(p), "(*:f32 x (sigmoid:f32 (*:f32 1.702f x)))");
  EXPECT_EQ(Count(p, NodeKind::kInput), 1);
  EXPECT_EQ(Count(p, NodeKind::kCast), 0);
  EXPECT_EQ(p.nodes.size(), 5u);  // x, 1.702f, *, sigmoid, *
  EXPECT_FALSE(p.reduction.has_value());
  // The f32 constant is the f32 nearest to 1.702.
  EXPECT_EQ(p.nodes[1].f, static_cast<double>(1.702f));
  EXPECT_EQ(p.definition.body, "y = x * sigmoid(1.702 * x)");
}

TEST(CompileTest, LiteralsAreWeakAndTakeTheOtherOperandsType) {
  EXPECT_EQ(Result(Ok("y = d * sigmoid(1.702 * d)", {Op("y", DType::kF64)})),
            "(*:f64 d (sigmoid:f64 (*:f64 1.702d d)))");
  EXPECT_EQ(Result(Ok("y = x * 2")), "(*:f32 x 2f)");
  EXPECT_EQ(Result(Ok("y = i * 2", {Op("y", DType::kI32)})), "(*:i64 i 2)");
  // A float literal meeting an integer makes f32.
  EXPECT_EQ(Result(Ok("y = i * 0.5")), "(*:f32 (cast:f32 i) 0.5f)");
  // Two weak operands stay weak: computed in f64 (or i64), converted once.
  EXPECT_EQ(Result(Ok("y = x * (2 * 0.25)")), "(*:f32 x (cast:f32 (*:f64 2d 0.25d)))");
  EXPECT_EQ(Result(Ok("y = x + 7 / 2")), "(+:f32 x (cast:f32 (/:i64 7 2)))");
  // A weak expression alone is stored converted.
  EXPECT_EQ(Result(Ok("y = 1.5")), "1.5d");
  EXPECT_EQ(Result(Ok("y = 3", {Op("y", DType::kU8)})), "3");
}

TEST(CompileTest, ParametersAreWeak) {
  EXPECT_EQ(Result(Ok("y = x * alpha")), "(*:f32 x (cast:f32 alpha))");
  EXPECT_EQ(Result(Ok("y = d * alpha", {Op("y", DType::kF64)})), "(*:f64 d alpha)");
  EXPECT_EQ(Result(Ok("y = x + n")), "(+:f32 x (cast:f32 n))");
  EXPECT_EQ(Result(Ok("y = i + n", {Op("y", DType::kI64)})), "(+:i64 i n)");
  EXPECT_EQ(Result(Ok("y = x * (alpha * 2)")), "(*:f32 x (cast:f32 (*:f64 alpha 2d)))");
  EXPECT_EQ(Result(Ok("y = x * (n * 0.5)")), "(*:f32 x (cast:f32 (*:f64 (cast:f64 n) 0.5d)))");
  EXPECT_EQ(Result(Ok("y = i * alpha")), "(*:f32 (cast:f32 i) (cast:f32 alpha))");
}

TEST(CompileTest, StrongOperandsPromoteBoolI64F32F64) {
  EXPECT_EQ(Result(Ok("y = x + d", {Op("y", DType::kF64)})), "(+:f64 (cast:f64 x) d)");
  EXPECT_EQ(Result(Ok("y = i + x")), "(+:f32 (cast:f32 i) x)");
  EXPECT_EQ(Result(Ok("y = i + d", {Op("y", DType::kF64)})), "(+:f64 (cast:f64 i) d)");
  // A cast is made once per value and type.
  Program p = Ok("y = i * x + i");
  EXPECT_EQ(Result(p), "(+:f32 (*:f32 (cast:f32 i) x) (cast:f32 i))");
  EXPECT_EQ(Count(p, NodeKind::kCast), 1);
}

TEST(CompileTest, PrecedenceAndAssociativityAreCs) {
  EXPECT_EQ(Result(Ok("y = x + w * x")), "(+:f32 x (*:f32 w x))");
  EXPECT_EQ(Result(Ok("y = (x + w) * x")), "(*:f32 (+:f32 x w) x)");
  EXPECT_EQ(Result(Ok("y = x - w - x")), "(-:f32 (-:f32 x w) x)");
  EXPECT_EQ(Result(Ok("y = x / w / x")), "(/:f32 (/:f32 x w) x)");
  EXPECT_EQ(Result(Ok("y = x % w * x")), "(*:f32 (%:f32 x w) x)");
  EXPECT_EQ(Result(Ok("y = -x * w")), "(*:f32 (neg:f32 x) w)");
  EXPECT_EQ(Result(Ok("y = -(x * w)")), "(neg:f32 (*:f32 x w))");
  EXPECT_EQ(Result(Ok("y = x < w == w > x", {Op("y", DType::kBool)})),
            "(==:bool (<:bool x w) (>:bool w x))");
  EXPECT_EQ(Result(Ok("y = m || m && !m", {Op("y", DType::kBool)})),
            "(||:bool m (&&:bool m (not:bool m)))");
  EXPECT_EQ(Result(Ok("y = x + 1 < w * 2 && m", {Op("y", DType::kBool)})),
            "(&&:bool (<:bool (+:f32 x 1f) (*:f32 w 2f)) m)");
  EXPECT_EQ(Result(Ok("y = x <= w || x >= w || x != w", {Op("y", DType::kBool)})),
            "(||:bool (||:bool (<=:bool x w) (>=:bool x w)) (!=:bool x w))");
}

TEST(CompileTest, ComparisonsGiveBoolFromOneOperandType) {
  EXPECT_EQ(Result(Ok("y = i < x", {Op("y", DType::kBool)})), "(<:bool (cast:f32 i) x)");
  EXPECT_EQ(Result(Ok("y = x > 0", {Op("y", DType::kBool)})), "(>:bool x 0f)");
  EXPECT_EQ(Result(Ok("y = m == (x > 0)", {Op("y", DType::kBool)})), "(==:bool m (>:bool x 0f))");
  EXPECT_EQ(Result(Ok("y = n > 2", {Op("y", DType::kBool)})), "(>:bool n 2)");
  EXPECT_EQ(Result(Ok("y = m != true", {Op("y", DType::kBool)})), "(!=:bool m true)");
}

TEST(CompileTest, WhereJoinsItsBranches) {
  EXPECT_EQ(Result(Ok("y = where(m, x * alpha, x)")), "(where:f32 m (*:f32 x (cast:f32 alpha)) x)");
  EXPECT_EQ(Result(Ok("y = where(x > 0, x, 0)")), "(where:f32 (>:bool x 0f) x 0f)");
  EXPECT_EQ(Result(Ok("y = where(m, i, x)")), "(where:f32 m (cast:f32 i) x)");
  EXPECT_EQ(Result(Ok("y = where(m, 1, 2.5)")), "(where:f64 m 1d 2.5d)");
  EXPECT_EQ(Result(Ok("y = where(m, m, false)", {Op("y", DType::kBool)})),
            "(where:bool m m false)");
  EXPECT_EQ(Result(Ok("y = x * where(m, 1, 0)")), "(*:f32 x (cast:f32 (where:i64 m 1 0)))");
  EXPECT_EQ(Result(Ok("y = where(m, x, -inf)")), "(where:f32 m x -inff)");
}

// A unary math function `f` keeps a float argument's type and promotes an integer to f32 (a
// constant to f64, then cast to the other operand's type).
void ExpectFloatFunctionTyping(const char* f) {
  EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(x)"))), absl::StrCat("(", f, ":f32 x)"));
  EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(d)"), {Op("y", DType::kF64)})),
            absl::StrCat("(", f, ":f64 d)"));
  EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(i)"))), absl::StrCat("(", f, ":f32 (cast:f32 i))"));
  EXPECT_EQ(Result(Ok(absl::StrCat("y = x * ", f, "(2)"))),
            absl::StrCat("(*:f32 x (cast:f32 (", f, ":f64 2d)))"));
}

TEST(CompileTest, MathFunctionsTakeFloatsAndPromoteIntegers) {
  for (const char* f : {"exp", "log", "sqrt", "rsqrt", "relu", "gelu", "sigmoid", "tanh"}) {
    SCOPED_TRACE(f);
    ExpectFloatFunctionTyping(f);
  }
  EXPECT_EQ(Result(Ok("y = abs(x)")), "(abs:f32 x)");
  EXPECT_EQ(Result(Ok("y = abs(i)", {Op("y", DType::kI32)})), "(abs:i64 i)");
  EXPECT_EQ(Result(Ok("y = maximum(i, 0)", {Op("y", DType::kI32)})), "(maximum:i64 i 0)");
  EXPECT_EQ(Result(Ok("y = minimum(x, i)")), "(minimum:f32 x (cast:f32 i))");
  EXPECT_EQ(Result(Ok("y = pow(x, 2)")), "(pow:f32 x 2f)");
  EXPECT_EQ(Result(Ok("y = pow(i, 2)")), "(pow:f32 (cast:f32 i) 2f)");
  EXPECT_EQ(Result(Ok("y = pow(d, x)", {Op("y", DType::kF64)})), "(pow:f64 d (cast:f64 x))");
}

TEST(CompileTest, NumpysMathFunctionsTakeFloatsAndPromoteIntegers) {
  for (const char* f : {"sin",  "cos",     "tan",     "arcsin",  "arccos", "arctan", "sinh",
                        "cosh", "arcsinh", "arccosh", "arctanh", "log10",  "log2",   "log1p",
                        "exp2", "expm1",   "cbrt",    "ceil",    "floor",  "trunc",  "round"}) {
    SCOPED_TRACE(f);
    ExpectFloatFunctionTyping(f);
  }
  for (const char* f : {"arctan2", "hypot", "copysign"}) {
    SCOPED_TRACE(f);
    EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(x, w)"))), absl::StrCat("(", f, ":f32 x w)"));
    EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(x, 2)"))), absl::StrCat("(", f, ":f32 x 2f)"));
    EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(d, i)"), {Op("y", DType::kF64)})),
              absl::StrCat("(", f, ":f64 d (cast:f64 i))"));
    EXPECT_EQ(Error(absl::StrCat("y = ", f, "(x)")),
              absl::StrCat("body line 1:5: ", f, " takes 2 arguments, found 1"));
  }
  // The predicates test a float and give a strong bool; an integer is tested as a float.
  for (const char* f : {"isnan", "isinf", "isfinite"}) {
    SCOPED_TRACE(f);
    EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(x)"), {Op("y", DType::kBool)})),
              absl::StrCat("(", f, ":bool x)"));
    EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(d * alpha)"), {Op("y", DType::kBool)})),
              absl::StrCat("(", f, ":bool (*:f64 d alpha))"));
    EXPECT_EQ(Result(Ok(absl::StrCat("y = ", f, "(i)"), {Op("y", DType::kBool)})),
              absl::StrCat("(", f, ":bool (cast:f32 i))"));
    EXPECT_EQ(Result(Ok(absl::StrCat("y = where(", f, "(x), 0, x)"))),
              absl::StrCat("(where:f32 (", f, ":bool x) 0f x)"));
    EXPECT_EQ(Error(absl::StrCat("y = ", f, "(m)"), {Op("y", DType::kBool)}),
              absl::StrCat("body line 1:5: ", f,
                           " needs numbers, found bool; convert a bool with int(...) or f32(...)"));
    EXPECT_THAT(Error(absl::StrCat("y = ", f, "(x)")), HasSubstr("output y is f32 but the "
                                                                 "expression is bool"));
  }
  // Their names are reserved.
  EXPECT_THAT(Error("let sin = x\ny = sin"), HasSubstr("let: sin is reserved"));
}

TEST(CompileTest, BitOperationsAreOnIntegersWithCsPrecedence) {
  const std::vector<OperandDef> i32 = {Op("y", DType::kI32)};
  EXPECT_EQ(Result(Ok("y = i & n", i32)), "(&:i64 i n)");
  EXPECT_EQ(Result(Ok("y = i | 1 ^ i & 3", i32)), "(|:i64 i (^:i64 1 (&:i64 i 3)))");
  EXPECT_EQ(Result(Ok("y = i << 2 + 1", i32)), "(<<:i64 i (+:i64 2 1))");
  EXPECT_EQ(Result(Ok("y = i >> 1 >> n", i32)), "(>>:i64 (>>:i64 i 1) n)");
  EXPECT_EQ(Result(Ok("y = i << 1 < i", {Op("y", DType::kBool)})), "(<:bool (<<:i64 i 1) i)");
  EXPECT_EQ(Result(Ok("y = (i & 1) == 0 && m", {Op("y", DType::kBool)})),
            "(&&:bool (==:bool (&:i64 i 1) 0) m)");
  EXPECT_EQ(Result(Ok("y = ~i", i32)), "(~:i64 i)");
  EXPECT_EQ(Result(Ok("y = ~-i", i32)), "(~:i64 (neg:i64 i))");
  EXPECT_EQ(Result(Ok("y = i + ~5", i32)), "(+:i64 i -6)");  // folded
  EXPECT_EQ(Result(Ok("y = int(x) ^ int(w)", i32)), "(^:i64 (cast:i64 x) (cast:i64 w))");
  // Weak integers stay weak: an all-literal bit operation takes the type of what it meets.
  EXPECT_EQ(Result(Ok("y = x * (1 << 4)")), "(*:f32 x (cast:f32 (<<:i64 1 4)))");
  // && and || keep working beside & and |.
  EXPECT_EQ(Result(Ok("y = m && m || !m", {Op("y", DType::kBool)})),
            "(||:bool (&&:bool m m) (not:bool m))");
}

TEST(CompileErrorTest, BitOperationsNeedIntegers) {
  EXPECT_EQ(Error("y = x & i"),
            "body line 1:7: operator & needs integers, found f32 and i64; convert a float with "
            "int(...) (truncates toward zero)");
  EXPECT_EQ(Error("y = i << 1.5", {Op("y", DType::kI32)}),
            "body line 1:7: operator << needs integers, found i64 and f64; convert a float with "
            "int(...) (truncates toward zero)");
  EXPECT_EQ(Error("y = m | m", {Op("y", DType::kBool)}),
            "body line 1:7: operator | needs integers, found bool and bool; for bools use ||");
  EXPECT_EQ(Error("y = m ^ m", {Op("y", DType::kBool)}),
            "body line 1:7: operator ^ needs integers, found bool and bool; for bools use !=");
  EXPECT_EQ(Error("y = i & 1 == 0", {Op("y", DType::kBool)}),
            "body line 1:7: operator & needs integers, found i64 and bool; convert a bool with "
            "int(...); note that & binds more loosely than comparisons, as in C: write (x & 1) "
            "== 0");
  EXPECT_EQ(Error("y = m >> 1", {Op("y", DType::kI32)}),
            "body line 1:7: operator >> needs integers, found bool and i64; convert a bool with "
            "int(...)");
  EXPECT_EQ(Error("y = ~x"),
            "body line 1:5: operator ~ needs an integer, found f32; convert "
            "with int(...) first");
  EXPECT_EQ(Error("y = ~m", {Op("y", DType::kBool)}),
            "body line 1:5: operator ~ needs an integer, found bool; use ! to negate a bool");
  EXPECT_EQ(Error("y = ~1.5"),
            "body line 1:5: operator ~ needs an integer, found f64; convert "
            "with int(...) first");
}

TEST(CompileTest, CastsConvertExplicitly) {
  EXPECT_EQ(Result(Ok("y = int(x)", {Op("y", DType::kI32)})), "(cast:i64 x)");
  EXPECT_EQ(Result(Ok("y = i64(d)", {Op("y", DType::kI64)})), "(cast:i64 d)");
  EXPECT_EQ(Result(Ok("y = f32(m)")), "(cast:f32 m)");
  EXPECT_EQ(Result(Ok("y = f64(x)", {Op("y", DType::kF64)})), "(cast:f64 x)");
  EXPECT_EQ(Result(Ok("y = bool(x)", {Op("y", DType::kBool)})), "(cast:bool x)");
  EXPECT_EQ(Result(Ok("y = int(m)", {Op("y", DType::kU8)})), "(cast:i64 m)");
  EXPECT_EQ(Result(Ok("y = f32(x)")), "x");  // already f32: no node
  // Constants convert to float types at compile time; a cast makes a weak value strong.
  EXPECT_EQ(Result(Ok("y = f32(1)")), "1f");
  EXPECT_EQ(Result(Ok("y = d + f32(0.1)", {Op("y", DType::kF64)})),
            absl::StrCat("(+:f64 d ", static_cast<double>(0.1f), "d)"));
  EXPECT_EQ(Result(Ok("y = x * f64(alpha)", {Op("y", DType::kF64)})), "(*:f64 (cast:f64 x) alpha)");
  EXPECT_EQ(Result(Ok("y = int(2.7)", {Op("y", DType::kI32)})), "(cast:i64 2.7d)");
  EXPECT_EQ(Result(Ok("y = x * f32(m)")), "(*:f32 x (cast:f32 m))");
  EXPECT_EQ(Error("y = f16(x)"),
            "body line 1:5: there is no f16(...) cast: values are bool, i64, f32 or f64 (the casts "
            "bool, int, i64, f32, f64), and an output of dtype f16 converts when it is stored");
  EXPECT_THAT(Error("y = i32(x)"), HasSubstr("there is no i32(...) cast"));
}

TEST(CompileTest, UnaryOperatorsFoldOnConstants) {
  EXPECT_EQ(Result(Ok("y = x * -1")), "(*:f32 x -1f)");
  EXPECT_EQ(Result(Ok("y = - - 2", {Op("y", DType::kI64)})), "2");
  EXPECT_EQ(Result(Ok("y = -x")), "(neg:f32 x)");
  EXPECT_EQ(Result(Ok("y = -i", {Op("y", DType::kI64)})), "(neg:i64 i)");
  EXPECT_EQ(Result(Ok("y = !true", {Op("y", DType::kBool)})), "false");
  EXPECT_EQ(Result(Ok("y = !!m", {Op("y", DType::kBool)})), "(not:bool (not:bool m))");
  // -9223372036854775807 - 1 is the smallest i64; negation of it wraps.
  Program p = Ok("y = -(-9223372036854775807 - 1)", {Op("y", DType::kI64)});
  EXPECT_EQ(Result(p), "(neg:i64 (-:i64 -9223372036854775807 1))");
}

TEST(CompileTest, InfAndNanAreWeakF64Constants) {
  Program p = Ok("y = x + inf - nan");
  const Node& inf = p.nodes[p.nodes[p.nodes[p.results[0]].args[0]].args[1]];
  EXPECT_EQ(inf.kind, NodeKind::kConst);
  EXPECT_EQ(inf.type, Type::kF32);
  EXPECT_TRUE(std::isinf(inf.f));
  const Node& nan = p.nodes[p.nodes[p.results[0]].args[1]];
  EXPECT_TRUE(std::isnan(nan.f));
  // A literal too large for f32 becomes inf where it meets an f32 (IEEE rounding).
  Program big = Ok("y = x * 1e300");
  EXPECT_TRUE(std::isinf(p.nodes[1].f));
  EXPECT_TRUE(std::isinf(big.nodes[1].f));
  // The largest f32 and the values that round to it stay finite.
  Program max = Ok("y = x * 3.4028235e38 + 3.40282356e38");
  for (const Node& n : max.nodes) {
    if (n.kind == NodeKind::kConst) {
      EXPECT_EQ(n.f, static_cast<double>(3.4028234663852886e38f));
    }
  }
}

TEST(CompileTest, NumbersInEveryForm) {
  EXPECT_EQ(Result(Ok("y = x + .5 + 1. + 1e3 + 2.5E+4 + 1e-2 + 007")),
            "(+:f32 (+:f32 (+:f32 (+:f32 (+:f32 (+:f32 x 0.5f) 1f) 1000f) 25000f) 0.01f) 7f)");
  EXPECT_EQ(Result(Ok("y = 9223372036854775807", {Op("y", DType::kI64)})), "9223372036854775807");
  EXPECT_EQ(Result(Ok("y = 4.9406564584124654e-324", {Op("y", DType::kF64)})), "4.94066e-324d");
  EXPECT_EQ(Result(Ok("y = 1.7976931348623157e308", {Op("y", DType::kF64)})), "1.79769e+308d");
}

TEST(CompileTest, StatementsCommentsAndSeparators) {
  Program p =
      Ok("# swish with a local\n"
         "\n"
         "let s = sigmoid(1.702 * x)   # the gate\r\n"
         "let unused = exp(x); let t = x * s\n"
         ";;\n"
         "y = t # done, caf\xc3\xa9 \x01 }\n");
  EXPECT_EQ(Result(p), "(*:f32 x (sigmoid:f32 (*:f32 1.702f x)))");
  EXPECT_EQ(Count(p, NodeKind::kCall), 1) << "an unused let makes no nodes";
  // Node positions point into the body (1-based).
  const Node& sig = p.nodes[p.nodes[p.results[0]].args[1]];
  EXPECT_EQ(sig.line, 3);
  EXPECT_EQ(sig.column, 9);
}

TEST(CompileTest, LetsAreSharedAndKeepWeakness) {
  Program p = Ok("let a = x * w\nlet b = a + a\ny = b * a");
  EXPECT_EQ(Result(p), "(*:f32 (+:f32 (*:f32 x w) (*:f32 x w)) (*:f32 x w))");
  EXPECT_EQ(p.nodes.size(), 5u);  // x, w, a, b, y
  EXPECT_EQ(Result(Ok("let c = 0.5\ny = x * c")), "(*:f32 x 0.5f)");
  EXPECT_EQ(Result(Ok("let c = 0.5\ny = d * c", {Op("y", DType::kF64)})), "(*:f64 d 0.5d)");
}

TEST(CompileTest, SeveralOutputsShareNodes) {
  Program p = Ok("let s = sigmoid(x)\nz = s > 0.5\ny = x * s", {Op("y"), Op("z", DType::kBool)});
  EXPECT_EQ(Result(p, 0), "(*:f32 x (sigmoid:f32 x))");
  EXPECT_EQ(Result(p, 1), "(>:bool (sigmoid:f32 x) 0.5f)");
  EXPECT_EQ(Count(p, NodeKind::kInput), 1);
  EXPECT_EQ(Count(p, NodeKind::kCall), 1);
}

TEST(CompileTest, OutputsConvertOnStoreButNotAcrossKinds) {
  // Widening and narrowing within a kind is implicit (stored as the catalog's cast).
  Ok("y = x", {Op("y", DType::kF16)});
  Ok("y = d", {Op("y", DType::kBF16)});
  Ok("y = x", {Op("y", DType::kF64)});
  Ok("y = i", {Op("y", DType::kU8)});
  Ok("y = i", {Op("y", DType::kF32)});  // integers into floats
  Ok("y = 1", {Op("y", DType::kF16)});
  Ok("y = m", {Op("y", DType::kBool)});
  EXPECT_EQ(Error("y = x", {Op("y", DType::kI32)}),
            "body line 1:1: output y is i32 but the expression is f32; use int(...) (truncates "
            "toward zero)");
  EXPECT_EQ(Error("y = 0.5", {Op("y", DType::kI64)}),
            "body line 1:1: output y is i64 but the expression is f64; use int(...) (truncates "
            "toward zero)");
  EXPECT_EQ(Error("y = x", {Op("y", DType::kBool)}),
            "body line 1:1: output y is bool but the expression is f32; compare it (x != 0) or "
            "use bool(...)");
  EXPECT_EQ(Error("y = 1", {Op("y", DType::kBool)}),
            "body line 1:1: output y is bool but the expression is i64; compare it (x != 0) or "
            "use bool(...)");
  EXPECT_EQ(Error("y = m"),
            "body line 1:1: output y is f32 but the expression is bool; convert it with "
            "f32(...) or where(...)");
  EXPECT_THAT(Error("y = m", {Op("y", DType::kU8)}), HasSubstr("convert it with int(...)"));
  EXPECT_THAT(Error("y = m", {Op("y", DType::kF64)}), HasSubstr("convert it with f64(...)"));
}

// ---- Reductions ---------------------------------------------------------------------------

TEST(CompileTest, SumIsMapThenReducedNode) {
  Program p = Ok("y = sum(x)");
  ASSERT_TRUE(p.reduction.has_value());
  EXPECT_EQ(p.reduction->combine, Combine::kSum);
  EXPECT_EQ(p.reduction->map, 0);
  EXPECT_EQ(p.reduction->accumulate, Type::kF32);
  ASSERT_EQ(p.nodes.size(), 2u);
  EXPECT_EQ(p.results[0], 1) << "no post-expression: the result is the kReduced node";
  EXPECT_EQ(Result(p), "reduced:f32");
}

TEST(CompileTest, RmsHasAPostExpressionWithCountAndParameters) {
  Definition d = Def("y = sqrt(sum(x * x) / count + eps)");
  d.params = {Float("eps", 1e-6)};
  Program p = Ok(d);
  ASSERT_TRUE(p.reduction.has_value());
  EXPECT_EQ(p.reduction->map, 1);
  EXPECT_EQ(Render(p, p.reduction->map), "(*:f32 x x)");
  EXPECT_EQ(Result(p), "(sqrt:f32 (+:f32 (/:f32 reduced:f32 (cast:f32 count)) (cast:f32 eps)))");
}

TEST(CompileTest, ReductionAccumulateTypes) {
  struct Case {
    const char* body;
    DType out;
    Combine combine;
    Type accumulate;
    const char* result;
  };
  const Case cases[] = {
      {"y = sum(d)", DType::kF64, Combine::kSum, Type::kF64, "reduced:f64"},
      {"y = sum(i)", DType::kI64, Combine::kSum, Type::kI64, "reduced:i64"},
      {"y = prod(x)", DType::kF32, Combine::kProd, Type::kF32, "reduced:f32"},
      {"y = min(i)", DType::kI32, Combine::kMin, Type::kI64, "reduced:i64"},
      {"y = max(d)", DType::kF64, Combine::kMax, Type::kF64, "reduced:f64"},
      {"y = argmin(x)", DType::kI64, Combine::kArgmin, Type::kI64, "reduced:i64"},
      {"y = argmax(d)", DType::kI64, Combine::kArgmax, Type::kI64, "reduced:i64"},
      {"y = argmax(x)", DType::kI32, Combine::kArgmax, Type::kI64, "reduced:i64"},
      {"y = f32(argmax(x)) / count", DType::kF32, Combine::kArgmax, Type::kI64,
       "(/:f32 (cast:f32 reduced:i64) (cast:f32 count))"},
      {"y = sum(int(m))", DType::kI64, Combine::kSum, Type::kI64, "reduced:i64"},
      {"y = sum(1)", DType::kI64, Combine::kSum, Type::kI64, "reduced:i64"},
      {"y = sum(x) / count", DType::kF32, Combine::kSum, Type::kF32,
       "(/:f32 reduced:f32 (cast:f32 count))"},
      {"y = sum(i) / count", DType::kI64, Combine::kSum, Type::kI64, "(/:i64 reduced:i64 count)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    Program p = Ok(c.body, {Op("y", c.out)});
    ASSERT_TRUE(p.reduction.has_value());
    EXPECT_EQ(p.reduction->combine, c.combine);
    EXPECT_EQ(p.reduction->accumulate, c.accumulate);
    EXPECT_EQ(Result(p), c.result);
  }
  // An index is an i64 value like any other: it may be stored into any numeric output.
  Ok("y = argmax(x)", {Op("y", DType::kF32)});
}

TEST(CompileTest, DotMaskedMaxAndParametersOnBothSides) {
  Program dot = Ok("y = sum(x * w)");
  EXPECT_EQ(Render(dot, dot.reduction->map), "(*:f32 x w)");
  Program masked = Ok("y = max(where(m, x, -inf))");
  EXPECT_EQ(Render(masked, masked.reduction->map), "(where:f32 m x -inff)");
  // A parameter (or a let of parameters) used in the map and after the reduction is
  // computed on both sides: nodes[0..map] are only the map's.
  Program p = Ok("let s = alpha * 2\ny = sum(x * s) * s");
  EXPECT_EQ(Render(p, p.reduction->map), "(*:f32 x (cast:f32 (*:f64 alpha 2d)))");
  EXPECT_EQ(Result(p), "(*:f32 reduced:f32 (cast:f32 (*:f64 alpha 2d)))");
  EXPECT_EQ(Count(p, NodeKind::kParam), 2);
  // A let of inputs may feed the map.
  Program q = Ok("let t = x * w\ny = sum(t) + 1");
  EXPECT_EQ(Render(q, q.reduction->map), "(*:f32 x w)");
  EXPECT_EQ(Result(q), "(+:f32 reduced:f32 1f)");
}

// ---- Errors -------------------------------------------------------------------------------

TEST(CompileErrorTest, SyntaxErrorsSayWhereAndWhatWasExpected) {
  EXPECT_EQ(Error("y = x +"), "body line 1:8: expected an expression, found the end of the body");
  EXPECT_EQ(Error("y = x +\nz"),
            "body line 1:8: expected an expression, found the end of the line");
  EXPECT_EQ(Error("y = pow(x 2)"),
            "body line 1:11: expected ',' after argument 1 of pow, found '2'");
  EXPECT_EQ(Error("y = pow(x, 2 x)"),
            "body line 1:14: expected ')' after the arguments of pow, found 'x'");
  EXPECT_EQ(Error("y = (x + 1"),
            "body line 1:11: expected ')' to close the '(' at line 1:5, found the end of the body");
  EXPECT_EQ(Error("y = x x"),
            "body line 1:7: expected an operator, or a new line or ';' after the statement, found "
            "'x'");
  EXPECT_EQ(Error("let = x"), "body line 1:5: expected a name after 'let', found '='");
  EXPECT_EQ(Error("let t x"), "body line 1:7: expected '=' after let t, found 'x'");
  EXPECT_EQ(Error("y x"), "body line 1:3: expected '=' after the output y, found 'x'");
  EXPECT_EQ(Error("y == x"), "body line 1:3: expected '=' after the output y, found '=='");
  EXPECT_EQ(Error("1 = x"),
            "body line 1:1: expected a statement (let NAME = EXPR, or OUTPUT = EXPR), found '1'");
  EXPECT_EQ(Error("y = let"), "body line 1:5: expected an expression, found 'let'");
  EXPECT_EQ(Error("y = +x"), "body line 1:5: expected an expression, found '+'");
  EXPECT_EQ(Error("y = x\n\n  y2 = (x))"),
            "body line 3:3: y2 is not an output of the kernel; did you mean y?");
  EXPECT_EQ(Error("let t = 1\ny = x * (t + )"),
            "body line 2:14: expected an expression, found ')'");
  EXPECT_EQ(Error("y = x ->"),
            "body line 1:7: expected an operator, or a new line or ';' after the "
            "statement, found '->'");
}

TEST(CompileErrorTest, LexicalErrors) {
  EXPECT_EQ(Error("y = x @ 1"), "body line 1:7: unexpected character '@'");
  EXPECT_EQ(Error("y = x $ 1"), "body line 1:7: unexpected character '$'");
  EXPECT_EQ(Error(std::string("y = x\x01")), "body line 1:6: unexpected byte 0x01");
  EXPECT_EQ(Error("y = \xc3\xa9"), "body line 1:5: unexpected byte 0xc3");
  EXPECT_EQ(Error("y = 2x"),
            "body line 1:5: malformed number '2x' (numbers are 12, 1.5, .5, 1e-3 or 2.5E+4)");
  EXPECT_THAT(Error("y = 1.5.3"), HasSubstr("malformed number '1.5.3'"));
  EXPECT_THAT(Error("y = 1e"), HasSubstr("malformed number '1e'"));
  EXPECT_EQ(Error("y = x + 9223372036854775808"),
            "body line 1:9: the integer 9223372036854775808 does not fit in i64 (the largest is "
            "9223372036854775807)");
  EXPECT_EQ(Error("y = x * 1e999"),
            "body line 1:9: the number 1e999 is too large for f64 (the largest is "
            "1.7976931348623157e+308)");
  EXPECT_THAT(Error("y = x * 1" + std::string(400, '0') + ".0"), HasSubstr("is too large for f64"));
  EXPECT_THAT(Error("y = x * 1e-999"),
              HasSubstr("body line 1:9: the number 1e-999 is too small for f64: it would round "
                        "to 0"));
  EXPECT_THAT(Error("y = x * 0." + std::string(400, '0') + "1"), HasSubstr("is too small"));
  // A huge literal is clipped in the message.
  std::string message = Error("y = x + " + std::string(5000, '9'));
  EXPECT_LT(message.size(), 200u);
  EXPECT_THAT(message, HasSubstr("does not fit in i64"));
}

TEST(CompileErrorTest, UnknownNamesSuggestOrList) {
  EXPECT_EQ(Error("y = xx"), "body line 1:5: unknown name xx; did you mean x?");
  EXPECT_EQ(Error("y = alpah"), "body line 1:5: unknown name alpah; did you mean alpha?");
  EXPECT_EQ(Error("y = zzzzzz"),
            "body line 1:5: unknown name zzzzzz; the names are alpha, d, i, m, n, w, ... (7 in "
            "all)");
  EXPECT_EQ(Error("y = sigmod(x)"),
            "body line 1:5: unknown function sigmod; did you mean sigmoid?");
  EXPECT_THAT(Error("y = foo(x)"), HasSubstr("unknown function foo; the functions are abs, exp"));
  EXPECT_EQ(Error("y = x(1)"), "body line 1:5: x is not a function");
  EXPECT_EQ(Error("y = exp"), "body line 1:5: exp is a function; call it: exp(...)");
  EXPECT_EQ(Error("y = exp(x, x)"), "body line 1:5: exp takes 1 argument, found 2");
  EXPECT_EQ(Error("y = pow(x)"), "body line 1:5: pow takes 2 arguments, found 1");
  EXPECT_EQ(Error("y = where(m, x)"), "body line 1:5: where takes 3 arguments, found 2");
  EXPECT_EQ(Error("y = sigmoid()"), "body line 1:5: sigmoid takes 1 argument, found 0");
  // Long unknown names are clipped.
  EXPECT_LT(Error("y = " + std::string(10000, 'q')).size(), 200u);
}

TEST(CompileErrorTest, TypeErrorsNameTheOperatorAndBothTypes) {
  EXPECT_EQ(Error("y = x + m"),
            "body line 1:7: operator + needs numbers, found f32 and bool; convert a bool with "
            "int(...) or f32(...), or choose with where(...)");
  EXPECT_THAT(Error("y = m * 2"), HasSubstr("operator * needs numbers, found bool and i64"));
  EXPECT_THAT(Error("y = m < m", {Op("y", DType::kBool)}),
              HasSubstr("operator < needs numbers, found bool and bool"));
  EXPECT_EQ(Error("y = x && m", {Op("y", DType::kBool)}),
            "body line 1:7: operator && needs bools, found f32 and bool; compare numbers first "
            "(x != 0)");
  EXPECT_EQ(Error("y = x == m", {Op("y", DType::kBool)}),
            "body line 1:7: operator == compares two numbers or two bools, found f32 and bool");
  EXPECT_EQ(Error("y = !x", {Op("y", DType::kBool)}),
            "body line 1:5: operator ! needs a bool, found f32; compare it instead (x == 0)");
  EXPECT_EQ(Error("y = -m"),
            "body line 1:5: operator - needs a number, found bool; use ! to negate a bool");
  EXPECT_EQ(Error("y = where(x, x, w)"),
            "body line 1:11: the condition of where must be bool, found f32; compare it (x > 0)");
  EXPECT_EQ(Error("y = where(m, x, m)"),
            "body line 1:5: where's branches must both be numbers or both bools, found f32 and "
            "bool");
  EXPECT_EQ(Error("y = exp(m)"),
            "body line 1:5: exp needs numbers, found bool; convert a bool with int(...) or "
            "f32(...)");
  EXPECT_THAT(Error("y = pow(x, m)"), HasSubstr("pow needs numbers, found f32 and bool"));
  EXPECT_THAT(Error("y = 1 < 2 < 3", {Op("y", DType::kBool)}),
              HasSubstr("body line 1:11: operator < needs numbers, found bool and i64"));
}

TEST(CompileErrorTest, NamesMustBeDefinedBeforeUse) {
  EXPECT_EQ(Error("let t = t + 1\ny = x"),
            "body line 1:9: name t is used before it is defined (let t at line 1:5)");
  EXPECT_EQ(Error("let a = b * 2\nlet b = a\ny = x"),
            "body line 1:9: name b is used before it is defined (let b at line 2:5)");
  EXPECT_EQ(Error("y = t\nlet t = x"),
            "body line 1:5: name t is used before it is defined (let t at line 2:5)");
  EXPECT_EQ(Error("let t = x\nlet t = w\ny = t"),
            "body line 2:5: let t is defined twice (first at line 1:5)");
  EXPECT_EQ(Error("let x = w\ny = x"),
            "body line 1:5: let x: x is already an input of the kernel; choose another name");
  EXPECT_THAT(Error("let alpha = 1\ny = x"), HasSubstr("alpha is already a parameter"));
  EXPECT_THAT(Error("let y = 1\ny = x"), HasSubstr("y is already an output"));
  EXPECT_EQ(Error("let sum = x\ny = sum"),
            "body line 1:5: let: sum is reserved (a function or keyword of the language); choose "
            "another name");
  EXPECT_THAT(Error("let count = x\ny = x"), HasSubstr("count is reserved"));
  EXPECT_THAT(Error("let Big = x\ny = Big"),
              HasSubstr("body line 1:5: let: the name Big is invalid"));
  std::string long_name(64, 'a');
  EXPECT_EQ(Error("let " + long_name + " = x\ny = x"),
            absl::StrCat("body line 1:5: let: the name ", long_name.substr(0, 40),
                         "... is 64 bytes; the limit is 63"));
  Ok("let " + std::string(63, 'a') + " = x\ny = " + std::string(63, 'a'));
  EXPECT_EQ(Error("y = x\nlet t = w"),
            "body line 2:1: every let must come before the output assignments; this one follows "
            "y = ... at line 1:1");
}

TEST(CompileErrorTest, OutputsAreAssignedExactlyOnceAndNeverRead) {
  EXPECT_EQ(Error("y = x\ny = w"), "body line 2:1: output y is assigned twice (first at line 1:1)");
  EXPECT_EQ(Error("y = x", {Op("y"), Op("z")}),
            "body: output z is never assigned; add a statement z = ...");
  EXPECT_EQ(Error(""), "body: the body has no statements; assign each output (y = ...)");
  EXPECT_EQ(Error("  # just a comment\n\n;\n"),
            "body: the body has no statements; assign each output (y = ...)");
  EXPECT_EQ(Error("x = w"), "body line 1:1: x is an input; only outputs are assigned (outputs: y)");
  EXPECT_THAT(Error("alpha = 1"), HasSubstr("alpha is a parameter; only outputs are assigned"));
  EXPECT_THAT(Error("let t = x\nt = 1"), HasSubstr("t is a let; a let cannot be reassigned"));
  EXPECT_EQ(Error("y = x\nz = y + 1", {Op("y"), Op("z")}),
            "body line 2:5: y is an output; outputs cannot be read (compute the value in a let "
            "and use that)");
}

TEST(CompileErrorTest, ReductionsAppearOnceInTheOutputStatement) {
  EXPECT_EQ(Error("y = x / count"),
            "body line 1:9: count is the number of reduced elements: it can only be used around "
            "the reduction of a reduction kernel's output statement (as in sum(x) / count), and "
            "this statement has no reduction");
  EXPECT_THAT(Error("let c = count\ny = sum(x) / c"),
              HasSubstr("body line 1:9: count (the number of reduced elements) cannot be used in a "
                        "let"));
  EXPECT_EQ(Error("y = sum(x / count)"),
            "body line 1:13: count cannot be used inside sum(...): it is the number of elements "
            "reduced, known after the reduction");
  EXPECT_EQ(Error("y = sum(x) + max(x)"),
            "body line 1:14: a second reduction, max(...); a reduction kernel has exactly one (sum "
            "at line 1:5)");
  EXPECT_EQ(Error("y = sum(max(x))"), "body line 1:9: max(...) cannot be nested inside sum(...)");
  EXPECT_EQ(Error("let s = sum(x)\ny = s"),
            "body line 1:9: sum(...) cannot be used in a let: a reduction appears once, in the "
            "output statement of a one-output kernel");
  EXPECT_EQ(Error("y = sum(x)\nz = x", {Op("y"), Op("z")}),
            "body line 1:5: sum(...) makes a reduction kernel, which has exactly one output; this "
            "kernel has 2");
  EXPECT_EQ(Error("y = sum(x) / x"),
            "body line 1:14: input x cannot be used outside sum(...): after a reduction only its "
            "result, count, parameters and constants are available");
  EXPECT_THAT(Error("y = x + sum(x)"), HasSubstr("body line 1:5: input x cannot be used outside"));
  EXPECT_THAT(Error("let t = x * 2\ny = sum(x) - t"),
              HasSubstr("body line 2:14: let t (it depends on an input) cannot be used outside "
                        "sum(...)"));
  EXPECT_EQ(Error("y = sum(m)"),
            "body line 1:5: sum needs numbers, found bool; use int(...) (sum(int(m)) counts the "
            "true elements)");
  EXPECT_THAT(Error("y = argmax(x)", {Op("y", DType::kBool)}),
              HasSubstr("output y is bool but the expression is i64"));
  EXPECT_THAT(Error("y = sum(x)", {Op("y", DType::kI32)}),
              HasSubstr("output y is i32 but the expression is f32"));
}

TEST(CompileErrorTest, SignatureErrors) {
  auto with = [](auto change) {
    Definition d = Def("y = x");
    change(d);
    return Error(d);
  };
  EXPECT_EQ(with([](Definition& d) { d.name = ""; }), "kernel name: the name is empty");
  EXPECT_THAT(with([](Definition& d) { d.name = "My-Kernel"; }),
              HasSubstr("kernel name: the name My-Kernel is invalid"));
  EXPECT_EQ(with([](Definition& d) { d.inputs[0].name = "X"; }),
            "input X: the name X is invalid: names are lowercase letters, digits and '_', not "
            "starting with a digit ([a-z_][a-z0-9_]*)");
  EXPECT_THAT(with([](Definition& d) { d.inputs[0].name = "1x"; }),
              HasSubstr("the name 1x is invalid"));
  EXPECT_EQ(with([](Definition& d) { d.inputs[1].name = ""; }), "inputs[1]: the name is empty");
  EXPECT_EQ(with([](Definition& d) { d.inputs[0].name = "sigmoid"; }),
            "input sigmoid: sigmoid is reserved (a function or keyword of the language); choose "
            "another name");
  for (const char* reserved : {"let", "true", "false", "count", "inf", "nan", "int", "f32", "i32",
                               "bf16", "float", "where", "argmax"}) {
    EXPECT_THAT(with([&](Definition& d) { d.params[0].name = reserved; }), HasSubstr("is reserved"))
        << reserved;
  }
  EXPECT_EQ(with([](Definition& d) { d.outputs[0].name = "x"; }),
            "the name x is used twice (input x and output x); inputs, outputs and parameters "
            "need distinct names");
  EXPECT_THAT(with([](Definition& d) { d.params[1].name = "alpha"; }),
              HasSubstr("the name alpha is used twice (parameter alpha and parameter alpha)"));
  EXPECT_EQ(with([](Definition& d) { d.inputs[0].dtype = static_cast<DType>(99); }),
            "input x: dtype 99 is not one of f32, f16, bf16, f64, i32, i64, u8, bool");
  EXPECT_EQ(with([](Definition& d) { d.outputs[0].rank = 9; }),
            "output y: rank 9 is out of range; a rank is 0 to 8, or -1 for any rank");
  EXPECT_THAT(with([](Definition& d) { d.inputs[0].rank = -2; }), HasSubstr("rank -2"));
  EXPECT_EQ(with([](Definition& d) { d.outputs.clear(); }),
            "the kernel has no outputs; it needs at least one");
  EXPECT_THAT(with([](Definition& d) { d.params[0].default_value = std::nan(""); }),
              HasSubstr("parameter alpha: the default nan is not finite"));
  EXPECT_THAT(with([](Definition& d) { d.params[1].default_value = 1.5; }),
              HasSubstr("parameter n: the default 1.5 of an int parameter must be an integer"));
  EXPECT_THAT(with([](Definition& d) { d.params[1].default_value = 1e17; }),
              HasSubstr("must be an integer of magnitude at most 2^53"));
  EXPECT_THAT(with([](Definition& d) { d.params[1].kind = static_cast<ScalarKind>(7); }),
              HasSubstr("parameter n: kind 7 is not float or int"));
  Ok(Def("y = x", {Op("y", DType::kF32, 8)}));
}

// ---- Limits, each at and just past its value ---------------------------------------------

TEST(CompileLimitTest, BodyBytes) {
  std::string body = "y = x\n#";
  body.resize(kMaxBodyBytes, 'c');
  Ok(body);
  body.push_back('c');
  EXPECT_EQ(Error(body), "the body is 16385 bytes; the limit is 16384");
  EXPECT_EQ(Error(std::string(1 << 20, '(')), "the body is 1048576 bytes; the limit is 16384");
  EXPECT_THAT(Error(std::string(100000, '(') + "x" + std::string(100000, ')')),
              HasSubstr("the limit is 16384"));
}

TEST(CompileLimitTest, NestingOfParenthesesAndCalls) {
  auto parens = [](int n) { return std::string(n, '(') + "x" + std::string(n, ')'); };
  Ok("y = " + parens(kMaxNesting));
  EXPECT_EQ(Error("y = " + parens(kMaxNesting + 1)),
            "body line 1:69: expressions nest deeper than 64 parentheses and calls; the limit is "
            "64");
  auto calls = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += "abs(";
    return s + "x" + std::string(n, ')');
  };
  Ok("y = " + calls(kMaxNesting));
  EXPECT_THAT(Error("y = " + calls(kMaxNesting + 1)), HasSubstr("nest deeper than 64"));
  auto mixed = [](int n_calls, int n_parens) {
    std::string s;
    for (int i = 0; i < n_calls; ++i) s += "abs(";
    return s + std::string(n_parens, '(') + "x" + std::string(n_calls + n_parens, ')');
  };
  Ok("y = " + mixed(32, 32));
  EXPECT_THAT(Error("y = " + mixed(32, 33)), HasSubstr("nest deeper than 64"));
  // Only open nesting counts: many groups side by side are fine.
  std::string flat = "y = x";
  for (int i = 0; i < 200; ++i) flat += " + (x)";
  Ok(flat);
  // A body of nothing but '(' up to the size limit fails at the 65th, without recursing.
  std::string deep = "y = " + std::string(kMaxBodyBytes - 4, '(');
  EXPECT_THAT(Error(deep), HasSubstr("body line 1:69: expressions nest deeper"));
}

TEST(CompileLimitTest, Nodes) {
  // x, then one node per '+': n pluses make n + 1 nodes.
  auto chain = [](size_t pluses) {
    std::string s = "y = x";
    for (size_t i = 0; i < pluses; ++i) s += "+x";
    return s;
  };
  Program p = Ok(chain(kMaxNodes - 1));
  EXPECT_EQ(p.nodes.size(), kMaxNodes);
  EXPECT_EQ(Error(chain(kMaxNodes)),
            "body: the program has 1025 nodes; the limit is 1024 (each operation, cast, constant "
            "and operand is a node)");
  // Long chains and prefix runs within the body limit are refused, not recursed into.
  EXPECT_THAT(Error(chain(8000)), HasSubstr("the program has 8001 nodes"));
  EXPECT_THAT(Error("y = " + std::string(16000, '-') + "x"), HasSubstr("nodes; the limit is 1024"));
  EXPECT_THAT(Error("y = f32(" + std::string(16000, '!') + "m)"), HasSubstr("the limit is 1024"));
  // Folded prefix operators on a constant make one node.
  EXPECT_EQ(Ok("y = " + std::string(16000, '-') + "1").nodes.size(), 1u);
}

TEST(CompileLimitTest, OperandAndParameterCounts) {
  Definition d = Def("y = x");
  d.inputs.clear();
  d.params.clear();
  for (size_t i = 0; i < kMaxInputs; ++i) d.inputs.push_back(Op(absl::StrCat("x", i)));
  d.inputs[0].name = "x";
  Ok(d);
  d.inputs.push_back(Op("extra"));
  EXPECT_EQ(Error(d), "the kernel has 17 inputs; the limit is 16");
  d.inputs.pop_back();

  for (size_t i = 1; i < kMaxOutputs; ++i) {
    d.outputs.push_back(Op(absl::StrCat("y", i)));
    d.body += absl::StrCat("\ny", i, " = x");
  }
  Ok(d);
  d.outputs.push_back(Op("z"));
  EXPECT_EQ(Error(d), "the kernel has 9 outputs; the limit is 8");
  d.outputs.pop_back();

  for (size_t i = 0; i < kMaxParams; ++i) d.params.push_back(Float(absl::StrCat("p", i)));
  Ok(d);
  d.params.push_back(Float("q"));
  EXPECT_EQ(Error(d), "the kernel has 17 parameters; the limit is 16");
}

TEST(CompileLimitTest, NameBytes) {
  const std::string ok(kMaxNameBytes, 'a'), long_name(kMaxNameBytes + 1, 'a');
  for (int which = 0; which < 4; ++which) {
    SCOPED_TRACE(which);
    Definition d = Def("y = x");
    auto set = [&](const std::string& name) {
      switch (which) {
        case 0:
          d.name = name;
          break;
        case 1:
          d.inputs[1].name = name;
          break;
        case 2:
          d.outputs[0].name = name;
          d.body = name + " = x";
          break;
        case 3:
          d.params[0].name = name;
          break;
      }
    };
    set(ok);
    Ok(d);
    set(long_name);
    EXPECT_THAT(Error(d), HasSubstr(absl::StrCat("is ", kMaxNameBytes + 1, " bytes; the limit is ",
                                                 kMaxNameBytes)));
  }
  Definition d = Def("y = x");
  d.inputs[0].name = std::string(1 << 20, 'a');
  EXPECT_LT(Error(d).size(), 200u);
}

// ---- The text form and the hash ---------------------------------------------------------------

constexpr char kSource[] = R"(# A swish with a learned slope.
kernel swish_k(x: f32, w: bf16[2], n: i32[0])   # inputs
    -> (y: f32, mask: bool[2])
  params(beta: float = 1.702, k: int = -3, e: float = -1.5e-07, t: int)
{
  let g = sigmoid(beta * x)  # a comment with } in it
  y = x * g + f32(n) * w
  mask = g > 0.5 && k < t
}  # trailing comment
)";

TEST(SourceTest, ParsesEveryPartOfTheHeader) {
  absl::StatusOr<Definition> d = ParseSource(kSource);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->name, "swish_k");
  ASSERT_EQ(d->inputs.size(), 3u);
  EXPECT_EQ(d->inputs[0].name, "x");
  EXPECT_EQ(d->inputs[0].dtype, DType::kF32);
  EXPECT_EQ(d->inputs[0].rank, -1);
  EXPECT_EQ(d->inputs[1].dtype, DType::kBF16);
  EXPECT_EQ(d->inputs[1].rank, 2);
  EXPECT_EQ(d->inputs[2].dtype, DType::kI32);
  EXPECT_EQ(d->inputs[2].rank, 0);
  ASSERT_EQ(d->outputs.size(), 2u);
  EXPECT_EQ(d->outputs[1].name, "mask");
  EXPECT_EQ(d->outputs[1].dtype, DType::kBool);
  ASSERT_EQ(d->params.size(), 4u);
  EXPECT_EQ(d->params[0].kind, ScalarKind::kFloat);
  EXPECT_EQ(d->params[0].default_value, 1.702);
  EXPECT_EQ(d->params[1].kind, ScalarKind::kInt);
  EXPECT_EQ(d->params[1].default_value, -3.0);
  EXPECT_EQ(d->params[2].default_value, -1.5e-07);
  EXPECT_EQ(d->params[3].default_value, std::nullopt);
  EXPECT_EQ(d->body,
            "  let g = sigmoid(beta * x)  # a comment with } in it\n"
            "  y = x * g + f32(n) * w\n"
            "  mask = g > 0.5 && k < t");
  Program p = Ok(*d);
  EXPECT_EQ(Result(p, 0),
            "(+:f32 (*:f32 x (sigmoid:f32 (*:f32 (cast:f32 beta) x))) (*:f32 (cast:f32 "
            "n) w))");
  EXPECT_EQ(Result(p, 1),
            "(&&:bool (>:bool (sigmoid:f32 (*:f32 (cast:f32 beta) x)) 0.5f) (<:bool k t))");
}

TEST(SourceTest, FormatIsCanonicalAndRoundTrips) {
  absl::StatusOr<Definition> d = ParseSource(kSource);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(FormatDefinition(*d),
            "kernel swish_k(x: f32, w: bf16[2], n: i32[0]) -> (y: f32, mask: bool[2])\n"
            "  params(beta: float = 1.702, k: int = -3, e: float = -1.5e-07, t: int)\n"
            "{\n"
            "  let g = sigmoid(beta * x)  # a comment with } in it\n"
            "  y = x * g + f32(n) * w\n"
            "  mask = g > 0.5 && k < t\n"
            "}\n");
  absl::StatusOr<Definition> again = ParseSource(FormatDefinition(*d));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameDefinition(*d, *again);

  Definition plain;
  plain.name = "k";
  plain.outputs = {Op("y", DType::kU8)};
  plain.body = "y = 1";
  EXPECT_EQ(FormatDefinition(plain), "kernel k() -> (y: u8)\n{\ny = 1\n}\n");

  // Bodies with edge whitespace, comments at the end, empty ones; every dtype; odd defaults.
  std::vector<Definition> cases;
  for (const char* body : {"", "\n", "\n\ny = x\n\n", "y = x # }", "  y = x\r\n", "y=x;#\n#"}) {
    Definition c = Def(body);
    cases.push_back(c);
  }
  Definition dtypes = Def("y = x");
  dtypes.inputs.clear();
  for (DType t : kAllDTypes) dtypes.inputs.push_back(Op(absl::StrCat("in_", DTypeName(t)), t, 3));
  dtypes.params = {Float("a", 0.1),
                   Float("b", -0.0),
                   Float("c", 1e300),
                   Float("d", 5e-324),
                   Int("e", -9007199254740992.0),
                   Int("f", 0),
                   Float("g", 123456789.0)};
  cases.push_back(dtypes);
  for (const Definition& c : cases) {
    SCOPED_TRACE(FormatDefinition(c));
    absl::StatusOr<Definition> back = ParseSource(FormatDefinition(c));
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameDefinition(c, *back);
    EXPECT_EQ(FormatDefinition(*back), FormatDefinition(c));
  }
}

TEST(SourceTest, ErrorsHaveLineAndColumn) {
  auto error = [](absl::string_view source) {
    absl::StatusOr<Definition> d = ParseSource(source);
    EXPECT_FALSE(d.ok()) << source;
    if (d.ok()) return std::string();
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(d.status().message());
  };
  EXPECT_EQ(error(""),
            "line 1:1: expected 'kernel' to start the definition, found the end of the "
            "file");
  EXPECT_EQ(error("kernal k() -> (y: f32) {}"),
            "line 1:1: expected 'kernel' to start the definition, found 'kernal'");
  EXPECT_EQ(error("kernel (x: f32) -> (y: f32) {}"),
            "line 1:8: expected the kernel's name after 'kernel', found '('");
  EXPECT_EQ(error("kernel k(x: f8) -> (y: f32) {}"),
            "line 1:13: expected the dtype of x (f32, f16, bf16, f64, i32, i64, u8 or bool), "
            "found 'f8'");
  EXPECT_EQ(error("kernel k(x f32) -> (y: f32) {}"),
            "line 1:12: expected ':' after input x, found 'f32'");
  EXPECT_EQ(error("kernel k(x: f32 y: f32) -> (y: f32) {}"),
            "line 1:17: expected ')' or ',' after input x, found 'y'");
  EXPECT_EQ(error("kernel k(x: f32) (y: f32) {}"),
            "line 1:18: expected '->' after the inputs, found '('");
  EXPECT_EQ(error("kernel k(x: f32[9]) -> (y: f32) {}"),
            "line 1:17: expected the rank of x (0 to 8; leave out [...] for any rank), found '9'");
  EXPECT_EQ(error("kernel k(x: f32) -> (y: f32)\n  params(n: int = 1.5) {}"),
            "line 2:19: expected the default of n (an integer), found '1.5'");
  EXPECT_EQ(error("kernel k(x: f32) -> (y: f32)\n  params(n: double) {}"),
            "line 2:13: expected the kind of parameter n (float or int), found 'double'");
  EXPECT_EQ(error("kernel k(x: f32) -> (y: f32)\n{\n  y = x\n"),
            "line 2:1: the body's '{' has no closing '}'");
  EXPECT_EQ(error("kernel k(x: f32) -> (y: f32) { y = x } extra"),
            "line 1:40: expected the end of the file after the body's closing '}', found 'extra'");
  EXPECT_EQ(error("kernel k(x: f32) -> (y: f32)\ny = x"),
            "line 2:1: expected 'params(...)' or '{' to open the body, found 'y'");
  EXPECT_EQ(error("kernel k(x: f32) -> (y: f32) @"), "line 1:30: unexpected character '@'");
  EXPECT_EQ(error("kernel k(x: f32) -> (y: f32) {} }"),
            "line 1:33: expected the end of the file after the body's closing '}', found '}'");
  // A body the language rejects still parses: Compile judges it.
  absl::StatusOr<Definition> d = ParseSource("kernel k(x: f32) -> (y: f32) { y = x @ 1 }");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->body, " y = x @ 1 ");
}

TEST(HashTest, IsTheSha256OfTheCanonicalText) {
  Definition d;
  d.name = "k";
  d.outputs = {Op("y", DType::kU8)};
  d.body = "y = 1";
  // sha256 of "kernel k() -> (y: u8)\n{\ny = 1\n}\n"
  EXPECT_EQ(Ok(d).hash, "a10fef109dee642243f5e8cb17a63d2f4b36152f7046694fbb41543a0529c40c");
}

TEST(HashTest, EqualDefinitionsHaveEqualHashes) {
  const Program a = Ok("y = x * sigmoid(1.702 * x)");
  const Program b = Ok("y = x * sigmoid(1.702 * x)");
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_NE(a.hash, Ok("y = x * sigmoid(1.702 * x) ").hash);
  Definition d = Def("y = x * sigmoid(1.702 * x)");
  d.params[0].default_value = 2.5;
  EXPECT_NE(a.hash, Ok(d).hash);
  d = Def("y = x * sigmoid(1.702 * x)");
  d.inputs[1].rank = 2;
  EXPECT_NE(a.hash, Ok(d).hash);
  absl::StatusOr<Definition> parsed = ParseSource(FormatDefinition(a.definition));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(Ok(*parsed).hash, a.hash);
}

// ---- Hostile input: never crashes, always a status ----------------------------------------

// Every compiled program is well formed and its text form round-trips.
void CheckAny(const Definition& d, bool valid_signature) {
  absl::StatusOr<Program> p = Compile(d);
  if (!p.ok()) {
    ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
    ASSERT_LT(p.status().message().size(), 1000u);
    if (valid_signature) {
      EXPECT_THAT(std::string(p.status().message()), StartsWith("body")) << d.body;
    }
    return;
  }
  ExpectWellFormed(*p);
  absl::StatusOr<Definition> back = ParseSource(FormatDefinition(d));
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << FormatDefinition(d);
  ExpectSameDefinition(d, *back);
}

TEST(FuzzTest, RandomBytes) {
  std::mt19937 rng(16);
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string body(rng() % 64, '\0');
    for (char& c : body) {
      // Mostly printable, some control and high bytes.
      c = static_cast<char>(rng() % 8 == 0 ? rng() % 256 : 32 + rng() % 95);
    }
    CheckAny(Def(body), true);
    ASSERT_TRUE(ParseSource(body).status().code() == absl::StatusCode::kInvalidArgument ||
                ParseSource(body).ok());
  }
}

TEST(FuzzTest, TokenSoup) {
  const std::vector<std::string> vocabulary = {
      "x",       "w",       "i",      "d",     "m",
      "alpha",   "n",       "y",      "z",     "t",
      "u",       "count",   "let",    "=",     "(",
      ")",       ",",       "+",      "-",     "*",
      "/",       "%",       "<",      "<=",    ">",
      ">=",      "==",      "!=",     "&&",    "||",
      "!",       "\n",      "&",      "|",     "^",
      "~",       "<<",      ">>",     "sin",   "arctan2",
      "round",   "isnan",   "hypot",  "log1p", ";",
      "0",       "1",       "2.5",    "1e3",   "9223372036854775807",
      "true",    "false",   "inf",    "nan",   "abs",
      "exp",     "log",     "sqrt",   "rsqrt", "relu",
      "gelu",    "sigmoid", "tanh",   "pow",   "maximum",
      "minimum", "where",   "bool",   "int",   "i64",
      "f32",     "f64",     "sum",    "prod",  "min",
      "max",     "argmin",  "argmax", "#",     "{",
      "}",       "->",      "@"};
  std::mt19937 rng(1616);
  int compiled = 0;
  for (int iteration = 0; iteration < 6000; ++iteration) {
    // Half start from a plausible statement shape, so that many get deep into the checker.
    std::string body;
    const int shape = iteration % 4;
    if (shape == 1) body = "y = ";
    if (shape == 2) body = "let t = ";
    if (shape == 3) body = "let t = x\ny = ";
    const size_t length = 1 + rng() % 24;
    for (size_t k = 0; k < length; ++k) {
      body += vocabulary[rng() % vocabulary.size()];
      body += rng() % 3 == 0 ? "" : " ";
    }
    std::vector<OperandDef> outputs = {Op("y", kAllDTypes[rng() % 8])};
    if (iteration % 5 == 0) outputs.push_back(Op("z", kAllDTypes[rng() % 8]));
    Definition d = Def(body, outputs);
    CheckAny(d, true);
    compiled += Compile(d).ok();
  }
  EXPECT_GT(compiled, 10) << "the soup should also produce valid programs";
}

// Random well-typed expressions over every operator and function: all compile.
class ExprGen {
 public:
  explicit ExprGen(uint32_t seed) : rng_(seed) {}

  std::string Num(int depth) {
    static const char* kLeaves[] = {"x", "w",   "i",    "d",   "alpha", "n",
                                    "2", "0.5", "1e-3", "inf", "7"};
    static const char* kBinary[] = {"+", "-", "*", "/", "%"};
    static const char* kUnary[] = {"abs",     "exp",     "log",    "sqrt",  "rsqrt", "relu",
                                   "gelu",    "sigmoid", "tanh",   "sin",   "cos",   "tan",
                                   "arcsin",  "arccos",  "arctan", "sinh",  "cosh",  "arcsinh",
                                   "arccosh", "arctanh", "log10",  "log2",  "log1p", "exp2",
                                   "expm1",   "cbrt",    "ceil",   "floor", "trunc", "round"};
    static const char* kTwo[] = {"pow", "maximum", "minimum", "arctan2", "hypot", "copysign"};
    static const char* kBits[] = {"&", "|", "^", "<<", ">>"};
    static const char* kCasts[] = {"int", "i64", "f32", "f64"};
    if (depth == 0 || Pick(4) == 0) return Of(kLeaves);
    switch (Pick(8)) {
      case 0:
        return "(" + Num(depth - 1) + " " + Of(kBinary) + " " + Num(depth - 1) + ")";
      case 1:
        return Of(kUnary) + "(" + Num(depth - 1) + ")";
      case 2:
        return Of(kTwo) + "(" + Num(depth - 1) + ", " + Num(depth - 1) + ")";
      case 3:
        return "where(" + Bool(depth - 1) + ", " + Num(depth - 1) + ", " + Num(depth - 1) + ")";
      case 4:
        return "-" + Num(depth - 1);
      case 5:
        return Of(kCasts) + "(" + Num(depth - 1) + ")";
      case 6:
        return Pick(2) == 0
                   ? "int(" + Bool(depth - 1) + ")"
                   : "(int(" + Num(depth - 1) + ") " + Of(kBits) + " ~int(" + Num(depth - 1) + "))";
      default:
        return Num(depth - 1) + " * " + Num(depth - 1) + " - " + Num(depth - 1);
    }
  }

  std::string Bool(int depth) {
    static const char* kLeaves[] = {"m", "true", "false"};
    static const char* kCompare[] = {"<", "<=", ">", ">=", "==", "!="};
    static const char* kLogic[] = {"&&", "||", "==", "!="};
    static const char* kPredicates[] = {"isnan", "isinf", "isfinite"};
    if (depth == 0 || Pick(4) == 0) return Of(kLeaves);
    switch (Pick(5)) {
      case 0:
        return "(" + Num(depth - 1) + " " + Of(kCompare) + " " + Num(depth - 1) + ")";
      case 1:
        return "(" + Bool(depth - 1) + " " + Of(kLogic) + " " + Bool(depth - 1) + ")";
      case 2:
        return "!(" + Bool(depth - 1) + ")";
      case 3:
        if (Pick(2) == 0) return Of(kPredicates) + "(" + Num(depth - 1) + ")";
        return "bool(" + Num(depth - 1) + ")";
      default:
        return "where(" + Bool(depth - 1) + ", " + Bool(depth - 1) + ", " + Bool(depth - 1) + ")";
    }
  }

  size_t Pick(size_t n) { return rng_() % n; }
  template <size_t N>
  std::string Of(const char* const (&options)[N]) {
    return options[Pick(N)];
  }

 private:
  std::mt19937 rng_;
};

TEST(FuzzTest, RandomWellTypedProgramsCompile) {
  ExprGen gen(2024);
  static const char* kReductions[] = {"sum", "prod", "min", "max", "argmin", "argmax"};
  for (int iteration = 0; iteration < 2000; ++iteration) {
    Definition d;
    if (iteration % 2 == 0) {
      d = Def(
          absl::StrCat("let a = ", gen.Num(4), "\ny = (", gen.Num(4), ") + a\nz = ", gen.Bool(4)),
          {Op("y", DType::kF64), Op("z", DType::kBool)});
    } else {
      d = Def(absl::StrCat("let a = ", gen.Num(3), "\ny = ", gen.Of(kReductions), "(", gen.Num(4),
                           " + a) ", gen.Pick(2) == 0 ? "/ count" : "* alpha - n"),
              {Op("y", DType::kF64)});
    }
    SCOPED_TRACE(d.body);
    Program p = Ok(d);
    EXPECT_EQ(p.reduction.has_value(), iteration % 2 == 1);
  }
}

TEST(FuzzTest, MutatedSources) {
  std::mt19937 rng(7);
  const std::string source = kSource;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string s = source;
    for (int edits = 1 + rng() % 4; edits > 0; --edits) {
      size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s.erase(at, 1 + rng() % 8);
          break;
        case 1:
          s.insert(at, 1, "(){}[]:,->=#\n x9-"[rng() % 17]);
          break;
        default:
          s[at] = static_cast<char>(rng() % 128);
      }
      if (s.empty()) s.push_back('k');  // not s = "k": a bogus -Wrestrict, GCC bug 105329
    }
    absl::StatusOr<Definition> d = ParseSource(s);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(d.status().message()), StartsWith("line "));
      continue;
    }
    CheckAny(*d, false);
  }
}

}  // namespace
}  // namespace tessera::kernels::expr
