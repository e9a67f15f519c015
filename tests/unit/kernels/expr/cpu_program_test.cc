// The CPU form of tenant-defined kernels (kernels/expr/cpu_program.h) against a reference
// evaluator written here: a tree walk per element in the semantics of kernels/expr/ast.h, each
// node correctly rounded to its type, carrying a bound on how far the backend may be from it
// (0 for the correctly rounded operations, the catalog's documented bound, kernels/accuracy.h,
// for the approximated math functions, propagated through later nodes). Programs are built as
// node vectors (not parsed): directed edge cases, then hundreds of generated DAGs over every
// dtype, broadcasting, empty tensors, chunk and task boundaries, and reductions over every
// axis set.
#include "kernels/expr/cpu_program.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#include "kernels/accuracy.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/expr/compile.h"
#include "kernels/expr/names.h"
#include "kernels/registry.h"
#include "tests/testing/host_tensor.h"

namespace tessera::kernels::expr {
namespace {

using testing::BroadcastSource;
using testing::HostTensor;
using testing::ThreadParallel;
using testing::Unravel;

constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using kernels::expr::internal::IsFloat;
using kernels::expr::internal::TypeName;

// ---- building programs ------------------------------------------------------------------------

class Builder {
 public:
  Builder(const std::vector<DType>& inputs, const std::vector<DType>& outputs,
          const std::vector<ScalarDef>& params = {}) {
    p_.definition.name = "test_kernel";
    for (size_t k = 0; k < inputs.size(); ++k) {
      p_.definition.inputs.push_back({"in" + std::to_string(k), inputs[k], -1});
    }
    for (size_t k = 0; k < outputs.size(); ++k) {
      p_.definition.outputs.push_back({"out" + std::to_string(k), outputs[k], -1});
    }
    p_.definition.params = params;
  }

  int32_t Input(int k) {
    return Add(
        {.kind = NodeKind::kInput, .type = ComputeType(p_.definition.inputs[k].dtype), .index = k});
  }
  int32_t Param(int k, Type t) { return Add({.kind = NodeKind::kParam, .type = t, .index = k}); }
  int32_t Const(Type t, double v) {
    Node n{.kind = NodeKind::kConst, .type = t};
    if (IsFloat(t)) {
      n.f = v;
    } else {
      n.i = static_cast<int64_t>(v);
    }
    return Add(n);
  }
  int32_t ConstI(int64_t v) { return Add({.kind = NodeKind::kConst, .type = Type::kI64, .i = v}); }
  int32_t Unary(UnaryOp op, int32_t a) {
    return Add(
        {.kind = NodeKind::kUnary, .type = TypeOf(a), .op = static_cast<uint8_t>(op), .args = {a}});
  }
  int32_t Binary(BinaryOp op, int32_t a, int32_t b) {
    const bool compare = op >= BinaryOp::kLt && op <= BinaryOp::kNe;
    return Add({.kind = NodeKind::kBinary,
                .type = compare ? Type::kBool : TypeOf(a),
                .op = static_cast<uint8_t>(op),
                .args = {a, b}});
  }
  int32_t Call(Func f, std::vector<int32_t> args) {
    return Add({.kind = NodeKind::kCall,
                .type = IsPredicate(f) ? Type::kBool : TypeOf(args[0]),
                .op = static_cast<uint8_t>(f),
                .args = std::move(args)});
  }
  int32_t Where(int32_t c, int32_t x, int32_t y) {
    return Add({.kind = NodeKind::kWhere, .type = TypeOf(x), .args = {c, x, y}});
  }
  int32_t Cast(int32_t a, Type t) {
    if (TypeOf(a) == t) return a;
    return Add({.kind = NodeKind::kCast, .type = t, .args = {a}});
  }
  int32_t Reduced(Type t) { return Add({.kind = NodeKind::kReduced, .type = t}); }
  int32_t Count() { return Add({.kind = NodeKind::kCount, .type = Type::kI64}); }

  void Results(std::vector<int32_t> results) { p_.results = std::move(results); }
  void Reduce(Combine c, int32_t map, Type accumulate) {
    p_.reduction = Reduction{c, map, accumulate};
  }

  Type TypeOf(int32_t n) const { return p_.nodes[n].type; }
  size_t size() const { return p_.nodes.size(); }
  const Program& program() const { return p_; }
  Program& program() { return p_; }

 private:
  int32_t Add(Node n) {
    p_.nodes.push_back(std::move(n));
    return static_cast<int32_t>(p_.nodes.size() - 1);
  }

  Program p_;
};

std::string Describe(const Program& p) {
  static const char* kKinds[] = {"input", "param", "const", "unary",   "binary",
                                 "call",  "where", "cast",  "reduced", "count"};
  static const char* kUnary[] = {"neg", "not", "bitnot"};
  static const char* kBinary[] = {"add", "sub",    "mul",   "div",    "mod", "lt",
                                  "le",  "gt",     "ge",    "eq",     "ne",  "and",
                                  "or",  "bitand", "bitor", "bitxor", "shl", "shr"};
  static const char* kFuncs[] = {
      "abs",    "exp",    "log",     "sqrt",     "rsqrt",   "relu",    "gelu",    "sigmoid",
      "tanh",   "pow",    "maximum", "minimum",  "sin",     "cos",     "tan",     "arcsin",
      "arccos", "arctan", "sinh",    "cosh",     "arcsinh", "arccosh", "arctanh", "log10",
      "log2",   "log1p",  "exp2",    "expm1",    "cbrt",    "ceil",    "floor",   "trunc",
      "round",  "isnan",  "isinf",   "isfinite", "arctan2", "hypot",   "copysign"};
  static_assert(std::size(kFuncs) == static_cast<size_t>(kLastFunc) + 1);
  std::ostringstream os;
  os << std::setprecision(17);
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const Node& n = p.nodes[i];
    os << "  %" << i << " = " << TypeName(n.type) << " " << kKinds[static_cast<int>(n.kind)];
    if (n.kind == NodeKind::kUnary) os << "." << kUnary[n.op];
    if (n.kind == NodeKind::kBinary) os << "." << kBinary[n.op];
    if (n.kind == NodeKind::kCall) os << "." << kFuncs[n.op];
    if (n.kind == NodeKind::kInput || n.kind == NodeKind::kParam) os << " #" << n.index;
    if (n.kind == NodeKind::kConst) os << " " << (IsFloat(n.type) ? n.f : static_cast<double>(n.i));
    for (int32_t a : n.args) os << " %" << a;
    os << "\n";
  }
  os << "  results:";
  for (int32_t r : p.results) os << " %" << r;
  if (p.reduction) {
    os << "  reduction combine " << static_cast<int>(p.reduction->combine) << " map %"
       << p.reduction->map << " acc " << TypeName(p.reduction->accumulate);
  }
  return os.str();
}

// ---- the reference ----------------------------------------------------------------------------

/// A reference value: exact for bool and i64; for floats the correctly rounded value, and a
/// bound `e` on the distance of the backend's value (0: bit for bit, NaN and -0 included).
/// `unknown`: no useful bound (the element is not checked).
struct RV {
  Type type = Type::kF32;
  int64_t i = 0;
  double v = 0;
  double e = 0;
  bool unknown = false;
};

DType StorageOf(Type t) { return t == Type::kF64 ? DType::kF64 : DType::kF32; }
double UlpT(Type t, double x) { return UlpOf(StorageOf(t), x); }
double MaxT(Type t) {
  return t == Type::kF64 ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max();
}
double EpsT(Type t) { return t == Type::kF64 ? 0x1p-52 : 0x1p-23; }
double TinyT(Type t) {
  return t == Type::kF64 ? std::numeric_limits<double>::min() / 2
                         : static_cast<double>(std::numeric_limits<float>::min()) / 2;
}
double RoundT(Type t, long double x) {
  return t == Type::kF64 ? static_cast<double>(x) : static_cast<double>(static_cast<float>(x));
}

RV Unknown(Type t) { return {.type = t, .unknown = true}; }
RV Int(Type t, int64_t i) { return {.type = t, .i = t == Type::kBool ? (i != 0) : i}; }
/// A float result; a bounded one near overflow or not finite is unknown.
RV Flt(Type t, double v, double e) {
  if (e > 0 && (!std::isfinite(v) || std::fabs(v) + e >= MaxT(t))) return Unknown(t);
  return {.type = t, .v = v, .e = e};
}

int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
int64_t WrapNeg(int64_t a) { return static_cast<int64_t>(0 - static_cast<uint64_t>(a)); }

/// Float to integer in [lo, hi]: truncation, saturation, NaN to 0.
int64_t FloatToIntRef(double v, int64_t lo, int64_t hi) {
  if (std::isnan(v)) return 0;
  const long double t = std::trunc(static_cast<long double>(v));
  if (t <= static_cast<long double>(lo)) return lo;
  if (t >= static_cast<long double>(hi)) return hi;
  return static_cast<int64_t>(t);
}

/// The documented bound of a catalog math function for a result of type t.
AccuracyBound MathBound(const char* name, Type t) { return BoundFor(name, StorageOf(t)); }

/// An approximated function's result from its exact value: the function's bound plus
/// `propagated` (the input error carried through the function).
RV Approx(Type t, long double exact, const AccuracyBound& b, double magnitude, double propagated) {
  if (std::isnan(exact)) return propagated > 0 ? Unknown(t) : Flt(t, kNaN, 0);
  if (std::isinf(exact)) return propagated > 0 ? Unknown(t) : Flt(t, static_cast<double>(exact), 0);
  const long double max = MaxT(t);
  const long double overflow = max + UlpT(t, MaxT(t)) / 2;
  const long double slack = 1 + 16 * EpsT(t);
  if (std::fabs(exact) >= overflow * slack) {
    return propagated > 0 ? Unknown(t) : Flt(t, exact > 0 ? kInf : -kInf, 0);
  }
  if (std::fabs(exact) >= max / slack) return Unknown(t);
  const double v = RoundT(t, exact);
  const double e = b.ulps * UlpT(t, v) + b.terms_ulps * EpsT(t) * magnitude + TinyT(t) + propagated;
  return Flt(t, v, e);
}

template <typename T>
double Op2(BinaryOp op, double a, double b) {
  const T x = static_cast<T>(a);
  const T y = static_cast<T>(b);
  switch (op) {
    case BinaryOp::kAdd:
      return static_cast<double>(x + y);
    case BinaryOp::kSub:
      return static_cast<double>(x - y);
    case BinaryOp::kMul:
      return static_cast<double>(x * y);
    case BinaryOp::kDiv:
      return static_cast<double>(x / y);
    case BinaryOp::kMod:
      return static_cast<double>(std::fmod(x, y));
    default:
      return kNaN;
  }
}

RV Arith(BinaryOp op, const RV& a, const RV& b, Type t) {
  if (t == Type::kI64) {
    switch (op) {
      case BinaryOp::kAdd:
        return Int(t, WrapAdd(a.i, b.i));
      case BinaryOp::kSub:
        return Int(t, WrapAdd(a.i, WrapNeg(b.i)));
      case BinaryOp::kMul:
        return Int(t, WrapMul(a.i, b.i));
      case BinaryOp::kDiv:
        if (b.i == 0) return Int(t, 0);
        if (b.i == -1) return Int(t, WrapNeg(a.i));
        return Int(t, a.i / b.i);
      case BinaryOp::kMod:
        if (b.i == 0 || b.i == -1) return Int(t, 0);
        return Int(t, a.i % b.i);
      default:
        return Unknown(t);
    }
  }
  const double v = t == Type::kF32 ? Op2<float>(op, a.v, b.v) : Op2<double>(op, a.v, b.v);
  if (a.e == 0 && b.e == 0) return Flt(t, v, 0);
  const double ea = a.e;
  const double eb = b.e;
  double e = 0;
  switch (op) {
    case BinaryOp::kAdd:
    case BinaryOp::kSub:
      e = ea + eb;
      break;
    case BinaryOp::kMul:
      e = std::fabs(a.v) * eb + std::fabs(b.v) * ea + ea * eb;
      break;
    case BinaryOp::kDiv: {
      const double d = std::fabs(b.v);
      if (!(d > eb * 1.01)) return Unknown(t);
      e = (std::fabs(a.v) * eb + d * ea) / (d * (d - eb));
      break;
    }
    default:
      return Unknown(t);  // fmod is discontinuous
  }
  if (!std::isfinite(a.v) || !std::isfinite(b.v)) return Unknown(t);
  e *= 1 + 4 * EpsT(t);
  return Flt(t, v, e + UlpT(t, std::fabs(v) + e));
}

bool CompareExact(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::kLt:
      return a < b;
    case BinaryOp::kLe:
      return a <= b;
    case BinaryOp::kGt:
      return a > b;
    case BinaryOp::kGe:
      return a >= b;
    case BinaryOp::kEq:
      return a == b;
    case BinaryOp::kNe:
      return a != b;
    default:
      return false;
  }
}

RV Compare(BinaryOp op, const RV& a, const RV& b) {
  if (!IsFloat(a.type)) {
    switch (op) {
      case BinaryOp::kLt:
        return Int(Type::kBool, a.i < b.i);
      case BinaryOp::kLe:
        return Int(Type::kBool, a.i <= b.i);
      case BinaryOp::kGt:
        return Int(Type::kBool, a.i > b.i);
      case BinaryOp::kGe:
        return Int(Type::kBool, a.i >= b.i);
      case BinaryOp::kEq:
        return Int(Type::kBool, a.i == b.i);
      default:
        return Int(Type::kBool, a.i != b.i);
    }
  }
  const bool decided = (a.e == 0 && b.e == 0) || std::isnan(a.v) || std::isnan(b.v) ||
                       std::fabs(static_cast<long double>(a.v) - b.v) > a.e + b.e;
  if (!decided) return Unknown(Type::kBool);
  return Int(Type::kBool, CompareExact(op, a.v, b.v));
}

RV CastRef(const RV& a, Type to) {
  if (a.type == to) return a;
  if (!IsFloat(a.type)) {
    if (to == Type::kF32) return Flt(to, static_cast<float>(a.i), 0);
    if (to == Type::kF64) return Flt(to, static_cast<double>(a.i), 0);
    return Int(to, a.i);
  }
  if (IsFloat(to)) {
    const double v = RoundT(to, a.v);
    if (a.e == 0) return Flt(to, v, 0);
    return Flt(to, v, a.e + (to == Type::kF32 ? UlpT(to, std::fabs(v) + a.e) : 0));
  }
  if (to == Type::kBool) {
    if (a.e == 0 || a.v - a.e > 0 || a.v + a.e < 0) return Int(to, a.v != 0 || std::isnan(a.v));
    return Unknown(to);
  }
  const int64_t lo = FloatToIntRef(a.v - a.e, kI64Min, kI64Max);
  const int64_t hi = FloatToIntRef(a.v + a.e, kI64Min, kI64Max);
  if (a.e > 0 && lo != hi) return Unknown(to);
  return Int(to, FloatToIntRef(a.v, kI64Min, kI64Max));
}

long double GeluExact(long double x) { return 0.5L * x * (1 + std::erf(x / std::sqrt(2.0L))); }

/// The exact value of a C-library function of the language (long double), its name for
/// BoundFor, and whether it is monotonic (so that its input's error carries through by the
/// values at the ends of the input's interval).
struct LibmRef {
  Func f;
  const char* name;
  long double (*exact)(long double);
  bool monotonic;
};
constexpr LibmRef kLibmRefs[] = {
    {Func::kSin, "sin", [](long double x) { return std::sin(x); }, false},
    {Func::kCos, "cos", [](long double x) { return std::cos(x); }, false},
    {Func::kArcsin, "arcsin", [](long double x) { return std::asin(x); }, true},
    {Func::kArccos, "arccos", [](long double x) { return std::acos(x); }, true},
    {Func::kArctan, "arctan", [](long double x) { return std::atan(x); }, true},
    {Func::kSinh, "sinh", [](long double x) { return std::sinh(x); }, true},
    {Func::kArcsinh, "arcsinh", [](long double x) { return std::asinh(x); }, true},
    {Func::kArccosh, "arccosh", [](long double x) { return std::acosh(x); }, true},
    {Func::kArctanh, "arctanh", [](long double x) { return std::atanh(x); }, true},
    {Func::kLog10, "log10", [](long double x) { return std::log10(x); }, true},
    {Func::kLog2, "log2", [](long double x) { return std::log2(x); }, true},
    {Func::kLog1p, "log1p", [](long double x) { return std::log1p(x); }, true},
    {Func::kExp2, "exp2", [](long double x) { return std::exp2(x); }, true},
    {Func::kExpm1, "expm1", [](long double x) { return std::expm1(x); }, true},
    {Func::kCbrt, "cbrt", [](long double x) { return std::cbrt(x); }, true},
    // Not monotonic, and no simple bound on how they carry an error: only exact inputs.
    {Func::kTan, "tan", [](long double x) { return std::tan(x); }, false},
    {Func::kCosh, "cosh", [](long double x) { return std::cosh(x); }, false},
};

/// A rounding function (ceil, floor, trunc, round): exact, and known under an input error
/// only when both ends of the input's interval round alike.
RV RoundingRef(Func f, const RV& a, Type t) {
  auto apply = [f](double x) {
    switch (f) {
      case Func::kCeil:
        return std::ceil(x);
      case Func::kFloor:
        return std::floor(x);
      case Func::kTrunc:
        return std::trunc(x);
      default:
        return std::nearbyint(x);  // half to even
    }
  };
  if (a.e > 0 && apply(a.v - a.e) != apply(a.v + a.e)) return Unknown(t);
  return Flt(t, apply(a.v), 0);
}

RV NewMathRef(Func f, const std::array<RV, 3>& args, Type t) {
  const RV& a = args[0];
  const RV& b = args[1];
  for (const LibmRef& r : kLibmRefs) {
    if (r.f != f) continue;
    const long double x = a.v;
    const long double exact = r.exact(x);
    double prop = 0;
    if (a.e > 0) {
      if (!std::isfinite(a.v)) return Unknown(t);
      if (f == Func::kSin || f == Func::kCos) {
        prop = a.e;  // 1-Lipschitz
      } else if (r.monotonic) {
        const long double lo = r.exact(x - a.e), hi = r.exact(x + a.e);
        if (!std::isfinite(lo) || !std::isfinite(hi)) return Unknown(t);
        prop = static_cast<double>(std::max(std::fabs(lo - exact), std::fabs(hi - exact)));
      } else {
        return Unknown(t);
      }
    }
    return Approx(t, exact, MathBound(r.name, t), 0, prop);
  }
  switch (f) {
    case Func::kCeil:
    case Func::kFloor:
    case Func::kTrunc:
    case Func::kRound:
      return RoundingRef(f, a, t);
    case Func::kCopysign:
      if (b.e > 0 && !(std::fabs(b.v) > b.e)) return Unknown(t);
      return Flt(t, std::copysign(a.v, b.v), a.e);
    case Func::kHypot: {
      const long double exact = std::hypot(static_cast<long double>(a.v), b.v);
      return Approx(t, exact, MathBound("hypot", t), 0, a.e + b.e);  // 1-Lipschitz in each
    }
    case Func::kArctan2: {
      if (a.e > 0 || b.e > 0) return Unknown(t);  // discontinuous on the negative axis
      const long double exact = std::atan2(static_cast<long double>(a.v), b.v);
      return Approx(t, exact, MathBound("arctan2", t), 0, 0);
    }
    case Func::kIsnan:
      return Int(Type::kBool, std::isnan(a.v));
    case Func::kIsinf:
      return Int(Type::kBool, std::isinf(a.v));
    case Func::kIsfinite:
      return Int(Type::kBool, std::isfinite(a.v));
    default:
      return Unknown(t);
  }
}

RV CallRef(Func f, const std::array<RV, 3>& args, Type t) {
  const RV& a = args[0];
  if (f >= Func::kSin) return NewMathRef(f, args, t);
  if (t == Type::kI64) {
    switch (f) {
      case Func::kAbs:
        return Int(t, a.i < 0 ? WrapNeg(a.i) : a.i);
      case Func::kMaximum:
        return Int(t, std::max(a.i, args[1].i));
      case Func::kMinimum:
        return Int(t, std::min(a.i, args[1].i));
      default:
        return Unknown(t);
    }
  }
  const bool f32 = t == Type::kF32;
  switch (f) {
    case Func::kAbs:
      return Flt(t, std::fabs(a.v), a.e);
    case Func::kRelu:
      return Flt(t, a.v < 0 ? 0.0 : a.v, a.e);
    case Func::kMaximum:
    case Func::kMinimum: {
      const RV& b = args[1];
      const bool max = f == Func::kMaximum;
      const double v = (a.v != a.v || (max ? a.v > b.v : a.v < b.v)) ? a.v : b.v;
      if (std::isnan(a.v) || std::isnan(b.v)) return Flt(t, kNaN, 0);
      return Flt(t, v, std::max(a.e, b.e));
    }
    case Func::kSqrt: {
      const double v = f32 ? std::sqrt(static_cast<float>(a.v)) : std::sqrt(a.v);
      if (a.e == 0) return Flt(t, v, 0);
      if (a.v - a.e < 0 || !std::isfinite(a.v)) return Unknown(t);
      const long double spread = std::sqrt(static_cast<long double>(a.v) + a.e) -
                                 std::sqrt(static_cast<long double>(a.v) - a.e);
      return Flt(t, v, static_cast<double>(spread) + UlpT(t, v));
    }
    case Func::kRsqrt: {
      const double v = f32 ? 1.0f / std::sqrt(static_cast<float>(a.v)) : 1.0 / std::sqrt(a.v);
      if (a.e == 0) return Flt(t, v, 0);
      if (a.v - a.e <= 0 || !std::isfinite(a.v)) return Unknown(t);
      const long double spread = 1 / std::sqrt(static_cast<long double>(a.v) - a.e) -
                                 1 / std::sqrt(static_cast<long double>(a.v) + a.e);
      return Flt(t, v, static_cast<double>(spread) + 2 * UlpT(t, v));
    }
    case Func::kExp: {
      const long double x = a.v;
      const double prop = a.e > 0 ? static_cast<double>(std::exp(x + a.e) - std::exp(x)) : 0;
      return Approx(t, std::exp(x), MathBound("exp", t), 0, prop);
    }
    case Func::kLog: {
      const long double x = a.v;
      if (a.e > 0 && !(x - a.e > 0)) return Unknown(t);
      const double prop = a.e > 0 ? static_cast<double>(std::log(x) - std::log(x - a.e)) : 0;
      return Approx(t, std::log(x), MathBound("log", t), 0, prop);
    }
    case Func::kTanh:
      return Approx(t, std::tanh(static_cast<long double>(a.v)), MathBound("tanh", t), 0, a.e);
    case Func::kSigmoid:
      return Approx(t, 1 / (1 + std::exp(-static_cast<long double>(a.v))), MathBound("sigmoid", t),
                    0, a.e / 4);
    case Func::kGelu:
      return Approx(t, GeluExact(a.v), MathBound("gelu", t), std::fabs(a.v), 1.13 * a.e);
    case Func::kPow: {
      const RV& b = args[1];
      const long double exact =
          std::pow(static_cast<long double>(a.v), static_cast<long double>(b.v));
      double prop = 0;
      if (a.e > 0 || b.e > 0) {
        if (!(a.v - a.e > 0) || !std::isfinite(a.v) || !std::isfinite(b.v)) return Unknown(t);
        for (double da : {-a.e, a.e}) {
          for (double db : {-b.e, b.e}) {
            const long double corner =
                std::pow(static_cast<long double>(a.v) + da, static_cast<long double>(b.v) + db);
            prop = std::max(prop, static_cast<double>(std::fabs(corner - exact)));
          }
        }
        if (!std::isfinite(prop)) return Unknown(t);
      }
      return Approx(t, exact, MathBound("pow", t), 0, prop);
    }
    default:
      break;  // NewMathRef
  }
  return Unknown(t);
}

/// The bit operations from their definition (docs/kernels.md): shifts as multiplication and
/// floor division by 2^n, a count outside 0..63 shifting every bit out.
int64_t BitRef(BinaryOp op, int64_t a, int64_t b) {
  const auto ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case BinaryOp::kBitAnd:
      return static_cast<int64_t>(ua & ub);
    case BinaryOp::kBitOr:
      return static_cast<int64_t>(ua | ub);
    case BinaryOp::kBitXor:
      return static_cast<int64_t>(ua ^ ub);
    case BinaryOp::kShl: {
      if (b < 0 || b > 63) return 0;
      uint64_t r = ua;
      for (int64_t k = 0; k < b; ++k) r *= 2;
      return static_cast<int64_t>(r);
    }
    default: {
      if (b < 0 || b > 63) return a < 0 ? -1 : 0;
      int64_t r = a;
      for (int64_t k = 0; k < b; ++k) r = r >= 0 ? r / 2 : -(-(r + 1) / 2) - 1;  // floor halving
      return r;
    }
  }
}

using ParamValue = std::variant<double, int64_t>;

struct RefEnv {
  const std::vector<RV>* inputs = nullptr;
  const std::vector<ParamValue>* params = nullptr;
  RV reduced;
  int64_t count = 0;
};

RV ConvertScalar(ParamValue p, Type t) {
  if (const double* d = std::get_if<double>(&p)) return CastRef(Flt(Type::kF64, *d, 0), t);
  return CastRef(Int(Type::kI64, std::get<int64_t>(p)), t);
}

/// Evaluates the nodes marked in `needed`, in order.
void EvalNodes(const Program& p, const std::vector<bool>& needed, const RefEnv& env,
               std::vector<RV>& vals) {
  vals.resize(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    if (!needed[i]) continue;
    const Node& n = p.nodes[i];
    std::array<RV, 3> args;
    bool unknown = false;
    for (size_t k = 0; k < n.args.size() && k < args.size(); ++k) {
      args[k] = vals[n.args[k]];
      unknown = unknown || args[k].unknown;
    }
    RV& out = vals[i];
    // where() needs only the chosen branch to be known.
    if (unknown && n.kind != NodeKind::kWhere) {
      out = Unknown(n.type);
      continue;
    }
    switch (n.kind) {
      case NodeKind::kInput:
        out = (*env.inputs)[n.index];
        break;
      case NodeKind::kParam:
        out = ConvertScalar((*env.params)[n.index], n.type);
        break;
      case NodeKind::kConst:
        out = IsFloat(n.type) ? Flt(n.type, RoundT(n.type, n.f), 0) : Int(n.type, n.i);
        break;
      case NodeKind::kReduced:
        out = env.reduced;
        break;
      case NodeKind::kCount:
        out = Int(Type::kI64, env.count);
        break;
      case NodeKind::kUnary:
        if (static_cast<UnaryOp>(n.op) == UnaryOp::kNot) {
          out = Int(Type::kBool, args[0].i == 0);
        } else if (static_cast<UnaryOp>(n.op) == UnaryOp::kBitNot) {
          out = Int(n.type, WrapAdd(WrapNeg(args[0].i), -1));  // ~a == -a - 1
        } else if (n.type == Type::kI64) {
          out = Int(n.type, WrapNeg(args[0].i));
        } else {
          out = Flt(n.type, -args[0].v, args[0].e);
        }
        break;
      case NodeKind::kBinary: {
        const auto op = static_cast<BinaryOp>(n.op);
        if (op == BinaryOp::kAnd) {
          out = Int(Type::kBool, args[0].i != 0 && args[1].i != 0);
        } else if (op == BinaryOp::kOr) {
          out = Int(Type::kBool, args[0].i != 0 || args[1].i != 0);
        } else if (op >= BinaryOp::kBitAnd) {
          out = Int(n.type, BitRef(op, args[0].i, args[1].i));
        } else if (op >= BinaryOp::kLt) {
          out = Compare(op, args[0], args[1]);
        } else {
          out = Arith(op, args[0], args[1], n.type);
        }
        break;
      }
      case NodeKind::kCall:
        out = CallRef(static_cast<Func>(n.op), args, n.type);
        break;
      case NodeKind::kWhere:
        if (args[0].unknown) {
          out = Unknown(n.type);
        } else {
          out = args[0].i != 0 ? args[1] : args[2];
        }
        break;
      case NodeKind::kCast:
        out = CastRef(args[0], n.type);
        break;
    }
    out.type = n.type;
  }
}

std::vector<bool> Needed(const Program& p, const std::vector<int32_t>& roots) {
  std::vector<bool> needed(p.nodes.size(), false);
  for (int32_t r : roots) needed[r] = true;
  for (size_t i = p.nodes.size(); i-- > 0;) {
    if (!needed[i]) continue;
    for (int32_t a : p.nodes[i].args) needed[a] = true;
  }
  return needed;
}

RV LoadRef(const HostTensor& t, int64_t i) {
  const Type type = ComputeType(t.meta.dtype);
  if (IsFloat(type)) return Flt(type, t.Get(i), 0);
  if (type == Type::kBool) return Int(type, t.Get(i) != 0);
  return Int(type, t.GetInt(i));
}

/// The combined value of one reduction from its map values, per ast.h and semantics.h.
RV CombineRef(Combine c, Type acc, const std::vector<RV>& vals) {
  const int64_t n = static_cast<int64_t>(vals.size());
  for (const RV& v : vals) {
    if (v.unknown) return Unknown(acc);
  }
  if (c == Combine::kArgmin || c == Combine::kArgmax) {
    const bool max = c == Combine::kArgmax;
    if (n == 0) return Int(Type::kI64, 0);
    auto value = [](const RV& v) { return IsFloat(v.type) ? v.v : static_cast<double>(v.i); };
    int64_t best = 0;
    for (int64_t j = 1; j < n; ++j) {
      const double b = value(vals[best]);
      const double x = value(vals[j]);
      if (b != b) break;
      if (x != x || (max ? x > b : x < b)) best = j;
    }
    // With errors, the winner must be clear of every other value by both bounds.
    if (std::isnan(value(vals[best]))) return Int(Type::kI64, best);
    for (int64_t j = 0; j < n; ++j) {
      if (j == best || (vals[j].e == 0 && vals[best].e == 0)) continue;
      if (!(std::fabs(value(vals[j]) - value(vals[best])) > vals[j].e + vals[best].e)) {
        return Unknown(Type::kI64);
      }
    }
    return Int(Type::kI64, best);
  }
  if (acc == Type::kI64) {
    int64_t r = c == Combine::kSum    ? 0
                : c == Combine::kProd ? 1
                : c == Combine::kMin  ? kI64Max
                                      : kI64Min;
    for (const RV& v : vals) {
      const int64_t x = CastRef(v, Type::kI64).i;
      switch (c) {
        case Combine::kSum:
          r = WrapAdd(r, x);
          break;
        case Combine::kProd:
          r = WrapMul(r, x);
          break;
        case Combine::kMin:
          r = std::min(r, x);
          break;
        default:
          r = std::max(r, x);
          break;
      }
    }
    return Int(acc, r);
  }
  std::vector<RV> xs;
  for (const RV& v : vals) xs.push_back(CastRef(v, acc));
  bool exact = true;
  for (const RV& x : xs) exact = exact && x.e == 0;
  if (c == Combine::kMin || c == Combine::kMax) {
    const bool max = c == Combine::kMax;
    double r = max ? -kInf : kInf;
    double e = 0;
    for (const RV& x : xs) {
      if (r != r) break;
      if (x.v != x.v || (max ? x.v > r : x.v < r)) r = x.v;
      e = std::max(e, x.e);
    }
    return Flt(acc, r, std::isnan(r) ? 0 : e);
  }
  if (c == Combine::kSum) {
    long double s = 0;
    double mag = 0;
    double e = 0;
    for (const RV& x : xs) {
      s += x.v;
      mag += std::fabs(x.v);
      e += x.e;
    }
    const double v = RoundT(acc, s);
    if (!std::isfinite(v)) return exact ? Flt(acc, v, 0) : Unknown(acc);
    const AccuracyBound b = BoundFor("sum", StorageOf(acc));
    const double growth = std::log2(std::max<double>(static_cast<double>(n), 1)) + 1;
    return Flt(acc, v, e + UlpT(acc, v) + b.terms_ulps * growth * EpsT(acc) * mag + TinyT(acc));
  }
  // kProd: relative errors add; values far from 1 risk intermediate overflow, not checked.
  long double prod = 1;
  double rel = 0;
  for (const RV& x : xs) {
    const double a = std::fabs(x.v);
    if (std::isfinite(x.v) && x.v != 0 && (a > 1e30 || a < 1e-30)) return Unknown(acc);
    if (x.e > 0 && !(a > x.e * 1.01)) return Unknown(acc);
    if (x.e > 0) rel += x.e / (a - x.e);
    prod *= x.v;
  }
  const double v = RoundT(acc, prod);
  if (!std::isfinite(v)) return exact ? Flt(acc, v, 0) : Unknown(acc);
  if (std::fabs(prod) > 1e300L || (prod != 0 && std::fabs(prod) < 1e-300L)) return Unknown(acc);
  const double e =
      static_cast<double>(std::fabs(prod)) * (rel * 1.01 + static_cast<double>(n + 2) * 0x1p-52) +
      UlpT(acc, v) + TinyT(acc);
  return Flt(acc, v, e);
}

// ---- comparing --------------------------------------------------------------------------------

struct Tally {
  int64_t checked = 0;
  int64_t skipped = 0;
  int failures = 0;
};

bool Same(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

/// The value a store of the exact (e == 0) or integer `r` to `dtype` must produce, as double.
double ExpectedStore(const RV& r, DType dtype) {
  if (!IsFloat(r.type)) {
    const int64_t i = r.i;
    switch (dtype) {
      case DType::kF32:
        return static_cast<float>(i);
      case DType::kF64:
        return static_cast<double>(i);
      case DType::kF16:
        return F16ToF32(F64ToF16(static_cast<double>(i)));
      case DType::kBF16:
        return BF16ToF32(F64ToBF16(static_cast<double>(i)));
      case DType::kI32:
        return static_cast<double>(std::clamp<int64_t>(i, INT32_MIN, INT32_MAX));
      case DType::kU8:
        return static_cast<double>(std::clamp<int64_t>(i, 0, 255));
      case DType::kBool:
        return i != 0;
      case DType::kI64:
        return static_cast<double>(i);
    }
  }
  const double v = r.v;
  const bool f32 = r.type == Type::kF32;
  switch (dtype) {
    case DType::kF32:
      return static_cast<float>(v);
    case DType::kF64:
      return v;
    case DType::kF16:
      return F16ToF32(f32 ? F32ToF16(static_cast<float>(v)) : F64ToF16(v));
    case DType::kBF16:
      return BF16ToF32(f32 ? F32ToBF16(static_cast<float>(v)) : F64ToBF16(v));
    case DType::kI32:
      return static_cast<double>(FloatToIntRef(v, INT32_MIN, INT32_MAX));
    case DType::kU8:
      return static_cast<double>(FloatToIntRef(v, 0, 255));
    case DType::kBool:
      return v != 0 || std::isnan(v);
    case DType::kI64:
      break;
  }
  return static_cast<double>(FloatToIntRef(v, kI64Min, kI64Max));
}

/// Checks output element `i` against `r`; returns a message on failure, "" on success or skip.
std::string CheckElement(const RV& r, const HostTensor& out, int64_t i, Tally& tally) {
  const DType dtype = out.meta.dtype;
  std::ostringstream os;
  os << std::setprecision(17);
  if (r.unknown) {
    ++tally.skipped;
    return "";
  }
  ++tally.checked;
  if (dtype == DType::kI64 && (!IsFloat(r.type) || r.e == 0)) {
    const int64_t want = IsFloat(r.type) ? FloatToIntRef(r.v, kI64Min, kI64Max) : r.i;
    if (out.GetInt(i) == want) return "";
    os << "got " << out.GetInt(i) << ", want " << want;
    return os.str();
  }
  const double got = out.Get(i);
  if (!IsFloat(r.type) || r.e == 0) {
    const double want = ExpectedStore(r, dtype);
    if (Same(got, want)) return "";
    os << "got " << got << ", want " << want << " (exact " << TypeName(r.type) << " "
       << (IsFloat(r.type) ? r.v : static_cast<double>(r.i)) << ")";
    return os.str();
  }
  // A bounded float: an integer or bool store must not straddle a boundary.
  if (!IsFloating(dtype)) {
    auto store = [&](double v) { return ExpectedStore(Flt(r.type, v, 0), dtype); };
    if (store(r.v - r.e) != store(r.v + r.e)) {
      --tally.checked;
      ++tally.skipped;
      return "";
    }
    if (got == store(r.v)) return "";
    os << "got " << got << ", want " << store(r.v) << " (from " << r.v << " +- " << r.e << ")";
    return os.str();
  }
  const double max = dtype == DType::kF16   ? 65504.0
                     : dtype == DType::kF64 ? MaxT(Type::kF64)
                                            : MaxT(Type::kF32);
  if (std::fabs(r.v) + r.e >= max * 0.99) {
    --tally.checked;
    ++tally.skipped;
    return "";
  }
  const double allowed = r.e + UlpOf(dtype, std::fabs(r.v) + r.e) + UlpOf(dtype, 0);
  if (std::fabs(got - r.v) <= allowed) return "";
  os << "got " << got << ", want " << r.v << " +- " << allowed;
  return os.str();
}

// ---- cases ------------------------------------------------------------------------------------

/// A program with its launch: inputs, parameter attributes and the output metas.
struct Case {
  Program program;
  std::vector<HostTensor> inputs;
  Attrs attrs;
  std::vector<TensorMeta> outputs;
};

Shape BroadcastAll(const std::vector<HostTensor>& inputs) {
  Shape s;
  for (const HostTensor& t : inputs) s = *BroadcastShapes(s, t.meta.shape);
  return s;
}

std::vector<bool> ReducedFlags(const Shape& s, const Attrs& attrs) {
  std::vector<bool> flags(s.size(), false);
  auto it = attrs.find("axes");
  const auto rank = static_cast<int64_t>(s.size());
  if (it == attrs.end() || std::get<std::vector<int64_t>>(it->second).empty()) {
    flags.assign(s.size(), true);
  } else {
    for (int64_t a : std::get<std::vector<int64_t>>(it->second)) flags[a < 0 ? a + rank : a] = true;
  }
  return flags;
}

bool KeepDims(const Attrs& attrs) {
  auto it = attrs.find("keepdims");
  return it != attrs.end() && std::get<bool>(it->second);
}

/// Sets the outputs' metas from the inputs, as the kernel's inference does.
void InferOutputs(Case& c) {
  const Shape s = BroadcastAll(c.inputs);
  Shape out = s;
  if (c.program.reduction) {
    const std::vector<bool> flags = ReducedFlags(s, c.attrs);
    out.clear();
    for (size_t d = 0; d < s.size(); ++d) {
      if (!flags[d]) {
        out.push_back(s[d]);
      } else if (KeepDims(c.attrs)) {
        out.push_back(1);
      }
    }
  }
  c.outputs.clear();
  for (const OperandDef& o : c.program.definition.outputs) c.outputs.push_back({o.dtype, out});
}

Plan MakePlan(const Case& c) {
  Plan plan;
  for (const HostTensor& t : c.inputs) plan.inputs.push_back(t.meta);
  plan.outputs = c.outputs;
  plan.attrs = c.attrs;
  return plan;
}

/// Runs the case; outputs start as a byte pattern that no correct store leaves.
std::vector<HostTensor> RunCase(const Case& c, const CpuProgram& cpu, Parallel& parallel,
                                absl::Status* status) {
  std::vector<HostTensor> out;
  for (const TensorMeta& m : c.outputs) {
    out.emplace_back(m.dtype, m.shape);
    std::fill(out.back().bytes.begin(), out.back().bytes.end(), 0xA5);
  }
  std::vector<const void*> in_ptrs;
  for (const HostTensor& t : c.inputs) in_ptrs.push_back(t.data());
  std::vector<void*> out_ptrs;
  for (HostTensor& t : out) out_ptrs.push_back(t.data());
  *status = cpu.Run(MakePlan(c), in_ptrs, out_ptrs, parallel);
  return out;
}

std::vector<ParamValue> ParamValues(const Case& c) {
  std::vector<ParamValue> values;
  for (const ScalarDef& d : c.program.definition.params) {
    auto it = c.attrs.find(d.name);
    double f = it == c.attrs.end() ? *d.default_value
               : std::holds_alternative<double>(it->second)
                   ? std::get<double>(it->second)
                   : static_cast<double>(std::get<int64_t>(it->second));
    if (d.kind == ScalarKind::kInt) {
      const int64_t i = it != c.attrs.end() && std::holds_alternative<int64_t>(it->second)
                            ? std::get<int64_t>(it->second)
                            : static_cast<int64_t>(f);
      values.emplace_back(i);
    } else {
      values.emplace_back(f);
    }
  }
  return values;
}

void Report(Tally& tally, const std::string& what, const std::string& message, int64_t element,
            std::string* report) {
  if (message.empty()) return;
  if (++tally.failures <= 5) {
    *report += what + " element " + std::to_string(element) + ": " + message + "\n";
  }
}

/// Compares every output element of `got` with the reference evaluation of the case.
Tally CheckCase(const Case& c, const std::vector<HostTensor>& got, std::string* report) {
  Tally tally;
  const Program& p = c.program;
  const std::vector<ParamValue> params = ParamValues(c);
  const Shape s = BroadcastAll(c.inputs);
  std::vector<RV> vals;
  std::vector<RV> in_vals(c.inputs.size());
  RefEnv env{&in_vals, &params, {}, 0};
  auto load_inputs = [&](const std::vector<int64_t>& index) {
    for (size_t k = 0; k < c.inputs.size(); ++k) {
      in_vals[k] = LoadRef(c.inputs[k], BroadcastSource(index, c.inputs[k].meta.shape));
    }
  };
  if (!p.reduction) {
    const std::vector<bool> needed = Needed(p, p.results);
    const int64_t n = CheckedNumElements(s);
    for (int64_t e = 0; e < n; ++e) {
      load_inputs(Unravel(e, s));
      EvalNodes(p, needed, env, vals);
      for (size_t k = 0; k < got.size(); ++k) {
        Report(tally, "output " + std::to_string(k),
               CheckElement(vals[p.results[k]], got[k], e, tally), e, report);
      }
    }
    return tally;
  }
  const std::vector<bool> flags = ReducedFlags(s, c.attrs);
  Shape kept_shape;
  Shape reduced_shape;
  for (size_t d = 0; d < s.size(); ++d) (flags[d] ? reduced_shape : kept_shape).push_back(s[d]);
  const int64_t kept = CheckedNumElements(kept_shape);
  const int64_t count = CheckedNumElements(reduced_shape);
  const std::vector<bool> map_needed = Needed(p, {p.reduction->map});
  const std::vector<bool> post_needed = Needed(p, p.results);
  std::vector<RV> map_vals;
  std::vector<int64_t> index(s.size());
  for (int64_t k = 0; k < kept; ++k) {
    const std::vector<int64_t> ki = Unravel(k, kept_shape);
    map_vals.clear();
    for (int64_t r = 0; r < count; ++r) {
      const std::vector<int64_t> ri = Unravel(r, reduced_shape);
      size_t a = 0;
      size_t b = 0;
      for (size_t d = 0; d < s.size(); ++d) index[d] = flags[d] ? ri[b++] : ki[a++];
      load_inputs(index);
      EvalNodes(p, map_needed, env, vals);
      map_vals.push_back(vals[p.reduction->map]);
    }
    env.reduced = CombineRef(p.reduction->combine, p.reduction->accumulate, map_vals);
    env.count = count;
    EvalNodes(p, post_needed, env, vals);
    Report(tally, "reduction", CheckElement(vals[p.results[0]], got[0], k, tally), k, report);
  }
  return tally;
}

// ---- generated programs -----------------------------------------------------------------------

enum class Size { kSmall, kChunks, kTasks, kEmpty };

class Generator {
 public:
  explicit Generator(uint32_t seed) : rng_(seed) {}

  Case Elementwise(Size size) {
    Case c;
    const int inputs = Uniform(1, 4);
    std::vector<DType> dtypes;
    for (int k = 0; k < inputs; ++k) dtypes.push_back(RandomDType());
    std::vector<DType> out_dtypes;
    for (int k = Uniform(1, 3); k > 0; --k) out_dtypes.push_back(RandomDType());
    Builder b(dtypes, out_dtypes, RandomParams());
    Leaves(b);
    const int ops = Uniform(1, size == Size::kTasks ? 12 : 30);
    for (int k = 0; k < ops; ++k) pool_.push_back(RandomOp(b));
    std::vector<int32_t> results;
    for (size_t k = 0; k < out_dtypes.size(); ++k) {
      // Mostly late nodes (deep expressions), sometimes a leaf.
      results.push_back(
          Chance(0.8) ? pool_[pool_.size() - 1 - Uniform(0, std::min<int>(2, pool_.size() - 1))]
                      : pool_[Uniform(0, static_cast<int>(pool_.size()) - 1)]);
    }
    b.Results(results);
    c.program = b.program();
    c.inputs = MakeInputs(dtypes, size);
    c.attrs = ParamAttrs(c.program.definition.params);
    InferOutputs(c);
    return c;
  }

  Case Reduce(Size size) {
    Case c;
    const int inputs = Uniform(1, 3);
    std::vector<DType> dtypes;
    for (int k = 0; k < inputs; ++k) dtypes.push_back(RandomDType());
    const std::vector<DType> out_dtypes = {RandomDType()};
    Builder b(dtypes, out_dtypes, RandomParams());
    Leaves(b);
    const int ops = Uniform(0, size == Size::kTasks ? 6 : 12);
    for (int k = 0; k < ops; ++k) pool_.push_back(RandomOp(b));
    const auto combine = static_cast<Combine>(Uniform(0, 5));
    int32_t map = pool_.back();
    if (combine == Combine::kProd) {
      // Products of many arbitrary values overflow: multiply values near 1.
      map = b.Call(Func::kTanh, {b.Cast(map, Type::kF64)});
      map = b.Binary(BinaryOp::kAdd, b.Const(Type::kF64, 1),
                     b.Binary(BinaryOp::kMul, map, b.Const(Type::kF64, 1e-3)));
    }
    if (b.TypeOf(map) == Type::kBool) map = b.Cast(map, Type::kI64);
    const bool index = combine == Combine::kArgmin || combine == Combine::kArgmax;
    const Type acc = index ? Type::kI64 : b.TypeOf(map);
    // The post-expression: the combined value alone, or a few operations on it, the count,
    // parameters and constants.
    pool_.clear();
    const int32_t reduced = b.Reduced(acc);
    int32_t root = reduced;
    if (Chance(0.6)) {
      pool_.push_back(reduced);
      pool_.push_back(b.Count());
      for (size_t k = 0; k < b.program().definition.params.size(); ++k) {
        pool_.push_back(b.Param(static_cast<int>(k), ParamType(b, k)));
      }
      for (int k = Uniform(1, 4); k > 0; --k) pool_.push_back(RandomOp(b));
      root = pool_.back();
    }
    b.Results({root});
    b.Reduce(combine, map, acc);
    c.program = b.program();
    c.inputs = MakeInputs(dtypes, size);
    c.attrs = ParamAttrs(c.program.definition.params);
    const Shape s = BroadcastAll(c.inputs);
    std::vector<int64_t> axes;
    for (size_t d = 0; d < s.size(); ++d) {
      if (Chance(0.5))
        axes.push_back(Chance(0.3) ? static_cast<int64_t>(d) - static_cast<int64_t>(s.size())
                                   : static_cast<int64_t>(d));
    }
    if (size == Size::kTasks && !s.empty()) {
      // Long reductions: reduce the largest dimension (the split-and-merge path).
      const auto largest = std::max_element(s.begin(), s.end()) - s.begin();
      if (std::find(axes.begin(), axes.end(), largest) == axes.end()) axes.push_back(largest);
    }
    std::shuffle(axes.begin(), axes.end(), rng_);
    if (!axes.empty() || Chance(0.5)) c.attrs["axes"] = axes;
    c.attrs["keepdims"] = Chance(0.5);
    InferOutputs(c);
    return c;
  }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T>
  T OneOf(std::initializer_list<T> values) {
    return values.begin()[Uniform(0, static_cast<int>(values.size()) - 1)];
  }

  DType RandomDType() { return kAllDTypes[Uniform(0, 7)]; }

  std::vector<ScalarDef> RandomParams() {
    std::vector<ScalarDef> params;
    for (int k = Uniform(0, 2); k > 0; --k) {
      ScalarDef d;
      d.name = absl::StrCat("p", params.size());
      d.kind = Chance(0.5) ? ScalarKind::kFloat : ScalarKind::kInt;
      if (Chance(0.3)) d.default_value = d.kind == ScalarKind::kFloat ? 0.75 : 3;
      params.push_back(d);
    }
    return params;
  }

  Attrs ParamAttrs(const std::vector<ScalarDef>& params) {
    Attrs attrs;
    for (const ScalarDef& d : params) {
      if (d.default_value && Chance(0.5)) continue;  // the default applies
      if (d.kind == ScalarKind::kFloat) {
        attrs[d.name] = OneOf({-1.5, 0.25, 1.702, 2.0, -0.0, 1e-3});
      } else {
        attrs[d.name] = OneOf<int64_t>({-3, 0, 2, 5, kI64Min});
      }
    }
    return attrs;
  }

  Type ParamType(const Builder& b, size_t k) {
    return b.program().definition.params[k].kind == ScalarKind::kInt
               ? Type::kI64
               : (Chance(0.5) ? Type::kF64 : Type::kF32);
  }

  // Inputs, parameters and a few constants start the pool.
  void Leaves(Builder& b) {
    pool_.clear();
    for (size_t k = 0; k < b.program().definition.inputs.size(); ++k) {
      pool_.push_back(b.Input(static_cast<int>(k)));
    }
    for (size_t k = 0; k < b.program().definition.params.size(); ++k) {
      pool_.push_back(b.Param(static_cast<int>(k), ParamType(b, k)));
    }
    for (int k = Uniform(0, 2); k > 0; --k) pool_.push_back(RandomConst(b, RandomType()));
  }

  Type RandomType() {
    const int r = Uniform(0, 99);
    return r < 45 ? Type::kF32 : r < 65 ? Type::kF64 : r < 90 ? Type::kI64 : Type::kBool;
  }

  int32_t RandomConst(Builder& b, Type t) {
    switch (t) {
      case Type::kBool:
        return b.Const(t, Uniform(0, 1));
      case Type::kI64:
        return b.ConstI(Chance(0.9) ? OneOf<int64_t>({0, 1, -1, 2, 3, 7, -5, 100})
                                    : OneOf<int64_t>({kI64Min, kI64Max}));
      default:
        return b.Const(t, Chance(0.9) ? OneOf({0.5, -1.5, 2.0, 1.702, 0.0, -0.0, 3.25, 1e-3})
                                      : OneOf({kInf, -kInf, kNaN, 1e30, 1e-40}));
    }
  }

  // A node of type t from the pool (mostly a recent one), or a new constant or cast.
  int32_t Pick(Builder& b, Type t) {
    std::vector<int32_t> candidates;
    for (int32_t n : pool_) {
      if (b.TypeOf(n) == t) candidates.push_back(n);
    }
    if (candidates.empty() || Chance(0.1)) {
      if (Chance(0.4) || pool_.empty()) return RandomConst(b, t);
      return b.Cast(pool_[Uniform(0, static_cast<int>(pool_.size()) - 1)], t);
    }
    if (Chance(0.6)) return candidates.back();
    return candidates[Uniform(0, static_cast<int>(candidates.size()) - 1)];
  }

  int32_t RandomOp(Builder& b) {
    const Type t = RandomType();
    if (t == Type::kBool) {
      switch (Uniform(0, 4)) {
        case 0: {
          const Type operands = OneOf({Type::kF32, Type::kF64, Type::kI64, Type::kBool});
          const auto op =
              static_cast<BinaryOp>(operands == Type::kBool ? OneOf({9, 10}) : Uniform(5, 10));
          return b.Binary(op, Pick(b, operands), Pick(b, operands));
        }
        case 1:
          return b.Binary(Chance(0.5) ? BinaryOp::kAnd : BinaryOp::kOr, Pick(b, t), Pick(b, t));
        case 2:
          return b.Unary(UnaryOp::kNot, Pick(b, t));
        case 3:
          return b.Where(Pick(b, t), Pick(b, t), Pick(b, t));
        default:
          if (Chance(0.4)) {
            const Func f = OneOf({Func::kIsnan, Func::kIsinf, Func::kIsfinite});
            return b.Call(f, {Pick(b, Chance(0.5) ? Type::kF32 : Type::kF64)});
          }
          return b.Cast(pool_[Uniform(0, static_cast<int>(pool_.size()) - 1)], t);
      }
    }
    switch (Uniform(0, 9)) {
      case 0:
      case 1:
      case 2: {
        if (t == Type::kI64 && Chance(0.3)) {
          const auto op = static_cast<BinaryOp>(
              Uniform(static_cast<int>(BinaryOp::kBitAnd), static_cast<int>(BinaryOp::kShr)));
          return b.Binary(
              op, Pick(b, t),
              Chance(0.5) ? b.ConstI(OneOf<int64_t>({0, 1, 13, 63, 64, -1, kI64Min})) : Pick(b, t));
        }
        const auto op = static_cast<BinaryOp>(Uniform(0, 4));
        return b.Binary(op, Pick(b, t), Pick(b, t));
      }
      case 3:
        if (t == Type::kI64 && Chance(0.3)) return b.Unary(UnaryOp::kBitNot, Pick(b, t));
        return b.Unary(UnaryOp::kNeg, Pick(b, t));
      case 4:
      case 5:
      case 6: {
        if (t == Type::kI64) {
          const Func f = OneOf({Func::kAbs, Func::kMaximum, Func::kMinimum});
          if (f == Func::kAbs) return b.Call(f, {Pick(b, t)});
          return b.Call(f, {Pick(b, t), Pick(b, t)});
        }
        Func f = static_cast<Func>(Uniform(0, static_cast<int>(kLastFunc)));
        if (IsPredicate(f)) f = Func::kSin;
        if (FuncArity(f) == 2) return b.Call(f, {Pick(b, t), Pick(b, t)});
        return b.Call(f, {Pick(b, t)});
      }
      case 7:
        return b.Where(Pick(b, Type::kBool), Pick(b, t), Pick(b, t));
      default:
        return b.Cast(pool_[Uniform(0, static_cast<int>(pool_.size()) - 1)], t);
    }
  }

  // Input shapes broadcasting to a common shape of the size class.
  std::vector<Shape> Shapes(size_t count, Size size) {
    Shape base;
    const int rank = size == Size::kSmall ? Uniform(0, 4) : Uniform(1, 3);
    for (int d = 0; d < rank; ++d) base.push_back(Uniform(1, size == Size::kTasks ? 2 : 5));
    if (size == Size::kChunks) base[Uniform(0, rank - 1)] = Uniform(300, 1500);
    if (size == Size::kTasks) base[Uniform(0, rank - 1)] = Uniform(140000, 200000);
    if (size == Size::kEmpty) base[Uniform(0, rank - 1)] = 0;
    std::vector<Shape> shapes;
    for (size_t k = 0; k < count; ++k) {
      const int r = k == 0 ? rank : Uniform(0, rank);
      Shape s(base.end() - r, base.end());
      for (int64_t& d : s) {
        if (k > 0 && Chance(0.3)) d = 1;
      }
      shapes.push_back(s);
    }
    std::shuffle(shapes.begin(), shapes.end(), rng_);
    return shapes;
  }

  std::vector<HostTensor> MakeInputs(const std::vector<DType>& dtypes, Size size) {
    std::vector<HostTensor> inputs;
    const std::vector<Shape> shapes = Shapes(dtypes.size(), size);
    for (size_t k = 0; k < dtypes.size(); ++k) {
      inputs.emplace_back(dtypes[k], shapes[k]);
      Fill(inputs.back());
    }
    return inputs;
  }

  void Fill(HostTensor& t) {
    for (int64_t i = 0; i < t.size(); ++i) {
      const bool special = Chance(0.04);
      switch (t.meta.dtype) {
        case DType::kF32:
        case DType::kF64:
        case DType::kF16:
        case DType::kBF16:
          t.Set(i, special
                       ? OneOf({0.0, -0.0, kInf, -kInf, kNaN, 1e-40, 1e30, -1e30, 65504.0, 1e-8})
                       : std::uniform_real_distribution<double>(-4, 4)(rng_));
          break;
        case DType::kI64: {
          const int64_t v =
              special ? OneOf<int64_t>({kI64Min, kI64Max, -1, 0, 1}) : Uniform(-50, 50);
          std::memcpy(static_cast<char*>(t.data()) + i * 8, &v, 8);
          break;
        }
        case DType::kI32:
          t.Set(i, special ? OneOf<double>({INT32_MIN, INT32_MAX, -1, 0}) : Uniform(-50, 50));
          break;
        case DType::kU8:
          t.Set(i, Uniform(0, 255));
          break;
        case DType::kBool:
          t.Set(i, Uniform(0, 1));
          break;
      }
    }
  }

  std::mt19937 rng_;
  std::vector<int32_t> pool_;
};

// ---- tests -------------------------------------------------------------------------------------

/// Runs chunks in reverse order on the calling thread (order-independence of the results).
class ReverseParallel final : public Parallel {
 public:
  void For(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> body) override {
    if (n <= 0) return;
    for (int64_t begin = (n - 1) / grain * grain; begin >= 0; begin -= grain) {
      body(begin, std::min(n, begin + grain));
    }
  }
  int Concurrency() const override { return 1; }
};

std::unique_ptr<const CpuProgram> BuildOrDie(const Program& p) {
  absl::StatusOr<std::unique_ptr<const CpuProgram>> cpu = CpuProgram::Build(p);
  EXPECT_TRUE(cpu.ok()) << cpu.status() << "\n" << Describe(p);
  return cpu.ok() ? *std::move(cpu) : nullptr;
}

/// Builds and runs the case serially, checks it against the reference, and checks that
/// other schedules of its chunks give the same bytes.
Tally Verify(const Case& c, const std::string& name) {
  Tally tally;
  std::unique_ptr<const CpuProgram> cpu = BuildOrDie(c.program);
  if (cpu == nullptr) return tally;
  SerialParallel serial;
  absl::Status status;
  const std::vector<HostTensor> got = RunCase(c, *cpu, serial, &status);
  EXPECT_TRUE(status.ok()) << name << ": " << status;
  if (!status.ok()) return tally;
  std::string report;
  tally = CheckCase(c, got, &report);
  std::ostringstream shapes;
  for (const HostTensor& t : c.inputs) shapes << " " << MetaString(t.meta);
  EXPECT_EQ(tally.failures, 0) << name << ": " << tally.failures << " wrong elements; inputs"
                               << shapes.str() << "\n"
                               << report << Describe(c.program);
  ThreadParallel threads(3);
  ReverseParallel reverse;
  for (Parallel* other : std::vector<Parallel*>{&threads, &reverse}) {
    const std::vector<HostTensor> again = RunCase(c, *cpu, *other, &status);
    EXPECT_TRUE(status.ok()) << status;
    for (size_t k = 0; k < got.size() && status.ok(); ++k) {
      EXPECT_EQ(got[k].bytes, again[k].bytes)
          << name << ": output " << k << " depends on the schedule\n"
          << Describe(c.program);
    }
  }
  return tally;
}

void ExpectMostlyChecked(const Tally& total) {
  ::testing::Test::RecordProperty("checked", std::to_string(total.checked));
  ::testing::Test::RecordProperty("skipped", std::to_string(total.skipped));
  // Elements whose reference bound is useless (a comparison within the error of an
  // approximated function, an overflow) are skipped; most must be checked.
  EXPECT_GT(total.checked, 3 * total.skipped)
      << total.checked << " checked, " << total.skipped << " skipped";
}

TEST(ExprCpuTest, GeneratedElementwisePrograms) {
  Tally total;
  const Size sizes[] = {Size::kSmall, Size::kSmall, Size::kSmall, Size::kChunks, Size::kEmpty};
  for (uint32_t seed = 0; seed < 400; ++seed) {
    Generator gen(seed);
    const Case c = gen.Elementwise(sizes[seed % 5]);
    const Tally t = Verify(c, "elementwise seed " + std::to_string(seed));
    total.checked += t.checked;
    total.skipped += t.skipped;
  }
  ExpectMostlyChecked(total);
}

TEST(ExprCpuTest, GeneratedReductions) {
  Tally total;
  const Size sizes[] = {Size::kSmall, Size::kSmall, Size::kSmall, Size::kChunks, Size::kEmpty};
  for (uint32_t seed = 0; seed < 400; ++seed) {
    Generator gen(1000 + seed);
    const Case c = gen.Reduce(sizes[seed % 5]);
    const Tally t = Verify(c, "reduction seed " + std::to_string(seed));
    total.checked += t.checked;
    total.skipped += t.skipped;
  }
  ExpectMostlyChecked(total);
}

TEST(ExprCpuTest, GeneratedProgramsOverManyTasks) {
  Tally total;
  for (uint32_t seed = 0; seed < 10; ++seed) {
    Generator gen(5000 + seed);
    const Case c = seed % 2 == 0 ? gen.Elementwise(Size::kTasks) : gen.Reduce(Size::kTasks);
    const Tally t = Verify(c, "large seed " + std::to_string(seed));
    total.checked += t.checked;
    total.skipped += t.skipped;
  }
  ExpectMostlyChecked(total);
}

// ---- directed cases ----------------------------------------------------------------------------

HostTensor Tensor(DType dtype, Shape shape, const std::vector<double>& values) {
  HostTensor t(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.Set(static_cast<int64_t>(i), values[i]);
  return t;
}

HostTensor I64Tensor(const std::vector<int64_t>& values) {
  HostTensor t(DType::kI64, {static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * 8);
  return t;
}

/// Builds and runs `b`'s program on `inputs` (serially); the status is expected OK.
std::vector<HostTensor> RunProgram(const Builder& b, std::vector<HostTensor> inputs,
                                   Attrs attrs = {}) {
  Case c;
  c.program = b.program();
  c.inputs = std::move(inputs);
  c.attrs = std::move(attrs);
  InferOutputs(c);
  std::unique_ptr<const CpuProgram> cpu = BuildOrDie(c.program);
  if (cpu == nullptr) return {};
  SerialParallel serial;
  absl::Status status;
  std::vector<HostTensor> out = RunCase(c, *cpu, serial, &status);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

std::vector<int64_t> Ints(const HostTensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.size(); ++i) v.push_back(t.GetInt(i));
  return v;
}

void ExpectFloats(const HostTensor& t, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(t.size(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(Same(t.Get(static_cast<int64_t>(i)), want[i]))
        << what << "[" << i << "]: got " << t.Get(static_cast<int64_t>(i)) << ", want " << want[i];
  }
}

TEST(ExprCpuTest, IntegerDivisionByZeroMinOverMinusOneAndOverflowWrap) {
  const std::vector<DType> outs(7, DType::kI64);
  Builder b({DType::kI64, DType::kI64}, outs);
  const int32_t x = b.Input(0);
  const int32_t y = b.Input(1);
  b.Results({b.Binary(BinaryOp::kDiv, x, y), b.Binary(BinaryOp::kMod, x, y),
             b.Binary(BinaryOp::kAdd, x, y), b.Binary(BinaryOp::kSub, x, y),
             b.Binary(BinaryOp::kMul, x, y), b.Unary(UnaryOp::kNeg, x), b.Call(Func::kAbs, {x})});
  const std::vector<HostTensor> out =
      RunProgram(b, {I64Tensor({7, -7, kI64Min, kI64Min, 5, kI64Max, 0, kI64Min}),
                     I64Tensor({0, 2, -1, 1, -1, 1, 0, 0})});
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(Ints(out[0]), (std::vector<int64_t>{0, -3, kI64Min, kI64Min, -5, kI64Max, 0, 0}));
  EXPECT_EQ(Ints(out[1]), (std::vector<int64_t>{0, -1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(Ints(out[2]),
            (std::vector<int64_t>{7, -5, kI64Max, kI64Min + 1, 4, kI64Min, 0, kI64Min}));
  EXPECT_EQ(Ints(out[3]),
            (std::vector<int64_t>{7, -9, kI64Min + 1, kI64Max, 6, kI64Max - 1, 0, kI64Min}));
  EXPECT_EQ(Ints(out[4]), (std::vector<int64_t>{0, -14, kI64Min, kI64Min, -5, kI64Max, 0, 0}));
  EXPECT_EQ(Ints(out[5]),
            (std::vector<int64_t>{-7, 7, kI64Min, kI64Min, -5, -kI64Max, 0, kI64Min}));
  EXPECT_EQ(Ints(out[6]), (std::vector<int64_t>{7, 7, kI64Min, kI64Min, 5, kI64Max, 0, kI64Min}));
}

TEST(ExprCpuTest, NarrowIntegersWidenAndStoresSaturate) {
  Builder b({DType::kI32, DType::kU8}, {DType::kI32, DType::kU8, DType::kI64});
  const int32_t sum = b.Binary(BinaryOp::kAdd, b.Input(0), b.Input(1));
  b.Results({sum, sum, sum});
  const std::vector<HostTensor> out = RunProgram(
      b, {Tensor(DType::kI32, {3}, {INT32_MAX, -300, 5}), Tensor(DType::kU8, {3}, {255, 1, 250})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(Ints(out[0]), (std::vector<int64_t>{INT32_MAX, -299, 255}));
  EXPECT_EQ(Ints(out[1]), (std::vector<int64_t>{255, 0, 255}));
  EXPECT_EQ(Ints(out[2]), (std::vector<int64_t>{int64_t{INT32_MAX} + 255, -299, 255}));
}

TEST(ExprCpuTest, FloatEdgeCases) {
  const double kDenorm = std::numeric_limits<float>::denorm_min();
  Builder b({DType::kF32, DType::kF32}, {DType::kF32, DType::kF32, DType::kF32, DType::kF32,
                                         DType::kF32, DType::kI32, DType::kBool, DType::kU8});
  const int32_t x = b.Input(0);
  const int32_t y = b.Input(1);
  b.Results({b.Call(Func::kRelu, {x}), b.Call(Func::kMaximum, {x, y}),
             b.Call(Func::kMinimum, {x, y}), b.Binary(BinaryOp::kDiv, x, y),
             b.Binary(BinaryOp::kMod, x, y), b.Cast(x, Type::kI64), b.Cast(x, Type::kBool), x});
  const std::vector<HostTensor> out =
      RunProgram(b, {Tensor(DType::kF32, {8}, {-0.0, kNaN, 1, -kInf, kDenorm, 5.5, -5.5, 3e9}),
                     Tensor(DType::kF32, {8}, {0.0, 1, kNaN, 2, 1, 2, 2, 0})});
  ASSERT_EQ(out.size(), 8u);
  ExpectFloats(out[0], {-0.0, kNaN, 1, 0, kDenorm, 5.5, 0, 3e9}, "relu");
  ExpectFloats(out[1], {0.0, kNaN, kNaN, 2, 1, 5.5, 2, 3e9}, "maximum");
  ExpectFloats(out[2], {0.0, kNaN, kNaN, -kInf, kDenorm, 2, -5.5, 0}, "minimum");
  ExpectFloats(out[3], {kNaN, kNaN, kNaN, -kInf, kDenorm, 2.75, -2.75, kInf}, "div");
  ExpectFloats(out[4], {kNaN, kNaN, kNaN, kNaN, kDenorm, 1.5, -1.5, kNaN}, "mod");
  EXPECT_EQ(Ints(out[5]), (std::vector<int64_t>{0, 0, 1, INT32_MIN, 0, 5, -5, INT32_MAX}));
  EXPECT_EQ(Ints(out[6]), (std::vector<int64_t>{0, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(Ints(out[7]), (std::vector<int64_t>{0, 0, 1, 0, 0, 5, 0, 255}));
}

TEST(ExprCpuTest, NarrowFloatStoresRoundToNearestEvenOnce) {
  Builder b({DType::kF32, DType::kF64}, {DType::kF16, DType::kBF16, DType::kBF16});
  b.Results({b.Input(0), b.Input(0), b.Input(1)});
  const std::vector<HostTensor> out =
      RunProgram(b, {Tensor(DType::kF32, {4}, {1 + 0x1p-11, 1 + 3 * 0x1p-11, 65520, -0.0}),
                     Tensor(DType::kF64, {4}, {1 + 0x1p-8 + 0x1p-30, 1 + 0x1p-8, kNaN, -kInf})});
  ASSERT_EQ(out.size(), 3u);
  ExpectFloats(out[0], {1, 1 + 0x1p-9, kInf, -0.0}, "f32 to f16");
  ExpectFloats(out[1], {1, 1, 65536, -0.0}, "f32 to bf16");
  // Rounded once from f64 (through f32 it would tie and round to even, 1).
  ExpectFloats(out[2], {1 + 0x1p-7, 1, kNaN, -kInf}, "f64 to bf16");
}

TEST(ExprCpuTest, ArgminArgmaxTakeTheFirstIndexAndNaNWins) {
  for (bool max : {true, false}) {
    Builder b({DType::kF32}, {DType::kI64});
    b.Results({b.Reduced(Type::kI64)});
    b.Reduce(max ? Combine::kArgmax : Combine::kArgmin, b.Input(0), Type::kI64);
    const HostTensor x = Tensor(DType::kF32, {5, 5}, {3,    1,    3,     1,    2,     //
                                                      1,    kNaN, 5,     kNaN, -1,    //
                                                      2,    2,    2,     2,    2,     //
                                                      0.0,  -0.0, -kInf, kInf, kInf,  //
                                                      -0.0, 0.0,  1,     -1,   1});
    const std::vector<HostTensor> rows =
        RunProgram(b, {x}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", false}});
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(Ints(rows[0]),
              max ? (std::vector<int64_t>{0, 1, 0, 3, 2}) : (std::vector<int64_t>{1, 1, 0, 2, 3}));
    const std::vector<HostTensor> columns =
        RunProgram(b, {x}, {{"axes", std::vector<int64_t>{-2}}, {"keepdims", true}});
    ASSERT_EQ(columns.size(), 1u);
    EXPECT_EQ(columns[0].meta.shape, (Shape{1, 5}));
    EXPECT_EQ(Ints(columns[0]),
              max ? (std::vector<int64_t>{0, 1, 1, 1, 3}) : (std::vector<int64_t>{3, 1, 3, 1, 1}));

    // Rows long enough to be split into parts combined in order.
    const int64_t n = 300000;
    HostTensor longer(DType::kF32, {2, n});
    for (int64_t i = 0; i < 2 * n; ++i) longer.Set(i, static_cast<double>(i % 5));
    longer.Set(100, 7);
    longer.Set(250000, 7);
    longer.Set(200000, -7);
    longer.Set(299999, -7);
    longer.Set(n + 290000, kNaN);
    longer.Set(n + 290001, 9);
    const std::vector<HostTensor> split =
        RunProgram(b, {longer}, {{"axes", std::vector<int64_t>{1}}});
    ASSERT_EQ(split.size(), 1u);
    EXPECT_EQ(Ints(split[0]),
              max ? (std::vector<int64_t>{100, 290000}) : (std::vector<int64_t>{200000, 290000}));
  }
}

TEST(ExprCpuTest, EmptyReductionsGiveIdentities) {
  struct Want {
    Combine combine;
    double f32;
    int64_t i64;
  };
  const Want wants[] = {{Combine::kSum, 0, 0},          {Combine::kProd, 1, 1},
                        {Combine::kMin, kInf, kI64Max}, {Combine::kMax, -kInf, kI64Min},
                        {Combine::kArgmin, 0, 0},       {Combine::kArgmax, 0, 0}};
  for (const Want& w : wants) {
    for (DType dtype : {DType::kF32, DType::kI64}) {
      const bool index = w.combine == Combine::kArgmin || w.combine == Combine::kArgmax;
      const Type acc = index ? Type::kI64 : ComputeType(dtype);
      Builder b({dtype}, {index ? DType::kI64 : dtype});
      b.Reduce(w.combine, b.Input(0), acc);
      b.Results({b.Reduced(acc)});
      const std::vector<HostTensor> out =
          RunProgram(b, {HostTensor(dtype, {3, 0})}, {{"axes", std::vector<int64_t>{-1}}});
      ASSERT_EQ(out.size(), 1u);
      ASSERT_EQ(out[0].size(), 3);
      for (int64_t k = 0; k < 3; ++k) {
        if (acc == Type::kF32) {
          EXPECT_TRUE(Same(out[0].Get(k), w.f32)) << static_cast<int>(w.combine);
        } else {
          EXPECT_EQ(out[0].GetInt(k), index ? 0 : w.i64) << static_cast<int>(w.combine);
        }
      }
    }
  }
  // mean = sum / count: 0 / 0.
  Builder b({DType::kF32}, {DType::kF32});
  b.Reduce(Combine::kSum, b.Input(0), Type::kF32);
  b.Results({b.Binary(BinaryOp::kDiv, b.Reduced(Type::kF32), b.Cast(b.Count(), Type::kF32))});
  const std::vector<HostTensor> mean = RunProgram(b, {HostTensor(DType::kF32, {0})});
  ASSERT_EQ(mean.size(), 1u);
  ExpectFloats(mean[0], {kNaN}, "mean of nothing");
}

TEST(ExprCpuTest, LargeFloatSumIsAsAccurateAsTheCatalogs) {
  const int64_t n = int64_t{1} << 22;
  HostTensor x(DType::kF32, {n});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(0, 1);
  long double exact = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(rng) + (i % 1000 == 0 ? 1000.0f : 0.0f);
    std::memcpy(static_cast<char*>(x.data()) + i * 4, &v, 4);
    exact += v;
  }
  Builder b({DType::kF32}, {DType::kF32});
  b.Reduce(Combine::kSum, b.Input(0), Type::kF32);
  b.Results({b.Reduced(Type::kF32)});
  const std::vector<HostTensor> ours = RunProgram(b, {x});
  ASSERT_EQ(ours.size(), 1u);

  absl::StatusOr<Plan> plan = Registry::Global().Prepare("sum", {x.meta}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  HostTensor catalog(DType::kF32, {});
  SerialParallel serial;
  ASSERT_TRUE(RunCpuKernel(*plan, {x.data()}, {catalog.data()}, serial).ok());

  const double ours_error = std::fabs(static_cast<long double>(ours[0].Get(0)) - exact);
  const double catalog_error = std::fabs(static_cast<long double>(catalog.Get(0)) - exact);
  const double ulp = UlpOf(DType::kF32, static_cast<double>(exact));
  EXPECT_LE(ours_error, 0.51 * ulp)
      << "sum " << ours[0].Get(0) << ", exact " << static_cast<double>(exact);
  EXPECT_LE(ours_error, catalog_error + 0.5 * ulp);
}

TEST(ExprCpuTest, ParametersComeFromAttributesOrDefaults) {
  ScalarDef alpha{"alpha", ScalarKind::kFloat, std::nullopt};
  ScalarDef k{"k", ScalarKind::kInt, 3.0};
  Builder b({DType::kF32}, {DType::kF32, DType::kI64});
  const int32_t scaled =
      b.Binary(BinaryOp::kMul, b.Input(0), b.Cast(b.Param(0, Type::kF64), Type::kF32));
  const int32_t kk = b.Param(1, Type::kI64);
  b.Results({b.Binary(BinaryOp::kAdd, scaled, b.Cast(kk, Type::kF32)),
             b.Binary(BinaryOp::kMul, kk, b.ConstI(2))});
  b.program().definition.params = {alpha, k};
  const HostTensor x = Tensor(DType::kF32, {2}, {1, -2});
  std::vector<HostTensor> out = RunProgram(b, {x}, {{"alpha", 2.5}});
  ASSERT_EQ(out.size(), 2u);
  ExpectFloats(out[0], {5.5, -2}, "default k");
  EXPECT_EQ(Ints(out[1]), (std::vector<int64_t>{6, 6}));
  out = RunProgram(b, {x}, {{"alpha", 0.5}, {"k", int64_t{-4}}});
  ASSERT_EQ(out.size(), 2u);
  ExpectFloats(out[0], {-3.5, -5}, "given k");
  EXPECT_EQ(Ints(out[1]), (std::vector<int64_t>{-8, -8}));
}

TEST(ExprCpuTest, BuildRefusesProgramsTheCheckerWouldNotProduce) {
  auto expect_internal = [](const Program& p, const std::string& what) {
    absl::StatusOr<std::unique_ptr<const CpuProgram>> cpu = CpuProgram::Build(p);
    EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInternal) << what << ": " << cpu.status();
  };
  {
    Builder b({DType::kF32}, {DType::kF32});
    const int32_t x = b.Input(0);
    b.Results({b.Binary(BinaryOp::kAdd, x, x)});
    b.program().nodes[1].args = {2, 0};
    expect_internal(b.program(), "a later argument");
  }
  {
    Builder b({DType::kF32}, {DType::kF32});
    b.Results({b.Binary(BinaryOp::kAdd, b.Input(0), b.ConstI(1))});
    expect_internal(b.program(), "mixed operand types");
  }
  {
    Builder b({DType::kF16}, {DType::kF32});
    b.Results({b.Input(0)});
    b.program().nodes[0].type = Type::kF64;
    expect_internal(b.program(), "an input of the wrong compute type");
  }
  {
    Builder b({DType::kF32}, {DType::kF32});
    b.Results({b.Reduced(Type::kF32)});
    expect_internal(b.program(), "a combined value without a reduction");
  }
  {
    Builder b({DType::kF32}, {DType::kF32, DType::kF32});
    b.Results({b.Input(0)});
    expect_internal(b.program(), "fewer results than outputs");
  }
  {
    Builder b({DType::kF32}, {DType::kI64});
    b.Reduce(Combine::kArgmax, b.Input(0), Type::kF32);
    b.Results({b.Reduced(Type::kF32)});
    expect_internal(b.program(), "argmax accumulating floats");
  }
  {
    Builder b({DType::kI64}, {DType::kI64});
    b.Results({b.Call(Func::kExp, {b.Input(0)})});
    expect_internal(b.program(), "exp of an integer");
  }
  {
    Builder b({DType::kF32}, {DType::kF32});
    b.Results({b.Call(Func::kExp, {b.Input(0)})});
    b.program().nodes[1].op = 200;
    expect_internal(b.program(), "an unknown function");
  }
}

TEST(ExprCpuTest, RunRefusesPlansThatDoNotMatch) {
  Builder b({DType::kF32, DType::kF32}, {DType::kF32},
            {{"alpha", ScalarKind::kFloat, std::nullopt}});
  b.Results({b.Binary(BinaryOp::kMul, b.Binary(BinaryOp::kAdd, b.Input(0), b.Input(1)),
                      b.Cast(b.Param(0, Type::kF64), Type::kF32))});
  std::unique_ptr<const CpuProgram> cpu = BuildOrDie(b.program());
  ASSERT_NE(cpu, nullptr);
  HostTensor x(DType::kF32, {4}), y(DType::kF32, {4}), out(DType::kF32, {4});
  SerialParallel serial;
  auto run = [&](Plan plan) { return cpu->Run(plan, {x.data(), y.data()}, {out.data()}, serial); };
  Plan good;
  good.inputs = {x.meta, y.meta};
  good.outputs = {out.meta};
  good.attrs = {{"alpha", 2.0}};
  EXPECT_TRUE(run(good).ok());
  Plan p = good;
  p.inputs[1].dtype = DType::kF64;
  EXPECT_EQ(run(p).code(), absl::StatusCode::kInternal);
  p = good;
  p.attrs.clear();
  EXPECT_EQ(run(p).code(), absl::StatusCode::kInternal);
  p = good;
  p.inputs[1].shape = {3};
  EXPECT_EQ(run(p).code(), absl::StatusCode::kInternal);
  p = good;
  p.outputs.push_back(out.meta);
  EXPECT_EQ(run(p).code(), absl::StatusCode::kInternal);

  Builder r({DType::kF32}, {DType::kF32});
  r.Reduce(Combine::kSum, r.Input(0), Type::kF32);
  r.Results({r.Reduced(Type::kF32)});
  std::unique_ptr<const CpuProgram> sum = BuildOrDie(r.program());
  ASSERT_NE(sum, nullptr);
  Plan reduce;
  reduce.inputs = {TensorMeta{DType::kF32, {2, 2}}};
  reduce.outputs = {TensorMeta{DType::kF32, {4}}};  // the reduction's is [2]
  reduce.attrs = {{"axes", std::vector<int64_t>{1}}};
  EXPECT_EQ(sum->Run(reduce, {x.data()}, {out.data()}, serial).code(), absl::StatusCode::kInternal);
  reduce.attrs = {{"axes", std::vector<int64_t>{2}}};
  EXPECT_EQ(sum->Run(reduce, {x.data()}, {out.data()}, serial).code(), absl::StatusCode::kInternal);
}

// The examples of docs/kernels.md, parsed and checked by Compile (kernels/expr/compile.h),
// then run on broadcast random inputs against the reference.
TEST(ExprCpuTest, CompiledDocumentationExamplesMatchTheReference) {
  struct Example {
    const char* source;
    std::vector<Shape> shapes;
    Attrs attrs;
  };
  const Example examples[] = {
      {"kernel swish(x: f32) -> (y: f32) { y = x * sigmoid(1.702 * x) }", {{3, 1500}}, {}},
      {"kernel masked_scale(x: f32, mask: bool) -> (y: f32) params(scale: float = 0.5)\n"
       "{ y = where(mask, x * scale, x) }",
       {{40, 7}, {40, 1}},
       {{"scale", 2.0}}},
      {"kernel rms(x: f32) -> (y: f32) params(eps: float = 1e-6) { y = sqrt(sum(x * x) / count + "
       "eps) }",
       {{5, 300}},
       {{"axes", std::vector<int64_t>{-1}}}},
      {"kernel dot(a: f32, b: f32) -> (y: f32) { y = sum(a * b) }", {{4, 1, 9}, {3, 9}}, {}},
      {"kernel first_max(x: f16) -> (i: i64) { i = argmax(x) }",
       {{6, 50}},
       {{"axes", std::vector<int64_t>{1}}}},
      {"kernel where_max(x: f32) -> (p: f32) { p = f32(argmax(x)) / count }", {{2000}}, {}},
      {"kernel stats(x: i32, w: f32) -> (pos: bool, scaled: f32, clipped: i32)\n"
       "  params(lo: int = 0, hi: int = 255, gain: float = 1.5)\n"
       "{\n  let v = maximum(x, lo)\n  let g = w * gain\n  pos = x > 0\n"
       "  scaled = f32(v) * g\n  clipped = minimum(v, hi)\n}",
       {{8, 16}, {16}},
       {{"hi", int64_t{20}}}},
      {"kernel masked_max(x: f64, m: bool) -> (y: f64) { y = max(where(m, x, -inf)) }",
       {{10, 10}, {10, 10}},
       {{"axes", std::vector<int64_t>{0}}, {"keepdims", true}}},
  };
  for (const Example& e : examples) {
    absl::StatusOr<Definition> definition = ParseSource(e.source);
    ASSERT_TRUE(definition.ok()) << e.source << ": " << definition.status();
    absl::StatusOr<Program> program = Compile(*std::move(definition));
    ASSERT_TRUE(program.ok()) << e.source << ": " << program.status();
    Case c;
    c.program = *std::move(program);
    std::mt19937 rng(11);
    for (size_t k = 0; k < e.shapes.size(); ++k) {
      c.inputs.emplace_back(c.program.definition.inputs[k].dtype, e.shapes[k]);
      c.inputs.back().Randomize(rng);
    }
    c.attrs = e.attrs;
    InferOutputs(c);
    Verify(c, e.source);
  }
}

}  // namespace
}  // namespace tessera::kernels::expr
