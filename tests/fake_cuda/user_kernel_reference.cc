// The reference evaluation of tenant-defined kernels for the CUDA tests (user_kernel_corpus.h):
// ast.h's semantics written out on the host, one element at a time, independently of the code
// generator and of the CPU backend's bytecode.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

#include "kernels/accuracy.h"
#include "kernels/expr/names.h"
#include "kernels/shape.h"
#include "tests/fake_cuda/user_kernel_corpus.h"

namespace tessera::testing {
namespace {

using kernels::DType;
using kernels::Shape;
using kernels::expr::BinaryOp;
using kernels::expr::Combine;
using kernels::expr::Func;
using kernels::expr::Node;
using kernels::expr::NodeKind;
using kernels::expr::Program;
using kernels::expr::ScalarKind;
using kernels::expr::Type;
using kernels::expr::UnaryOp;

using kernels::expr::internal::IsFloat;

struct Value {
  Type type = Type::kF32;
  bool b = false;
  int64_t i = 0;
  float f = 0;
  double d = 0;
};

int64_t SaturateI64(double v) {
  if (std::isnan(v)) return 0;
  v = std::trunc(v);
  if (v <= -9223372036854775808.0) return INT64_MIN;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  return static_cast<int64_t>(v);
}

double AsDouble(const Value& v) {
  switch (v.type) {
    case Type::kBool:
      return v.b ? 1 : 0;
    case Type::kI64:
      return static_cast<double>(v.i);
    case Type::kF32:
      return v.f;
    case Type::kF64:
      return v.d;
  }
  return 0;
}

Value Make(Type t) {
  Value v;
  v.type = t;
  return v;
}

Value Convert(const Value& v, Type to) {
  if (v.type == to) return v;
  Value r = Make(to);
  switch (to) {
    case Type::kBool:
      r.b = v.type == Type::kI64 ? v.i != 0 : AsDouble(v) != 0;
      break;
    case Type::kI64:
      r.i = v.type == Type::kBool ? (v.b ? 1 : 0) : SaturateI64(AsDouble(v));
      break;
    case Type::kF32:
      r.f = v.type == Type::kI64 ? static_cast<float>(v.i) : static_cast<float>(AsDouble(v));
      break;
    case Type::kF64:
      r.d = AsDouble(v);
      break;
  }
  return r;
}

Value Load(const HostTensor& t, int64_t offset) {
  const uint8_t* p =
      t.bytes.data() + offset * static_cast<int64_t>(kernels::DTypeSize(t.meta.dtype));
  Value v = Make(kernels::expr::ComputeType(t.meta.dtype));
  switch (t.meta.dtype) {
    case DType::kF32:
      std::memcpy(&v.f, p, 4);
      break;
    case DType::kF16:
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      v.f = t.meta.dtype == DType::kF16 ? kernels::F16ToF32(h) : kernels::BF16ToF32(h);
      break;
    }
    case DType::kF64:
      std::memcpy(&v.d, p, 8);
      break;
    case DType::kI32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      v.i = x;
      break;
    }
    case DType::kI64:
      std::memcpy(&v.i, p, 8);
      break;
    case DType::kU8:
      v.i = *p;
      break;
    case DType::kBool:
      v.b = *p != 0;
      break;
  }
  return v;
}

void Store(const Value& v, HostTensor& t, int64_t offset) {
  uint8_t* p = t.bytes.data() + offset * static_cast<int64_t>(kernels::DTypeSize(t.meta.dtype));
  auto clamp = [&](int64_t lo, int64_t hi) -> int64_t {
    if (v.type == Type::kI64) return std::clamp(v.i, lo, hi);
    if (v.type == Type::kBool) return v.b ? 1 : 0;
    const double x = AsDouble(v);
    if (std::isnan(x)) return 0;
    const double tr = std::trunc(x);
    if (tr <= static_cast<double>(lo)) return lo;
    if (tr >= static_cast<double>(hi)) return hi;
    return static_cast<int64_t>(tr);
  };
  switch (t.meta.dtype) {
    case DType::kF32: {
      const float f = Convert(v, Type::kF32).f;
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kF64: {
      const double d = AsDouble(v);
      std::memcpy(p, &d, 8);
      break;
    }
    case DType::kF16:
    case DType::kBF16: {
      const bool half = t.meta.dtype == DType::kF16;
      const uint16_t h =
          v.type == Type::kF32
              ? (half ? kernels::F32ToF16(v.f) : kernels::F32ToBF16(v.f))
              : (half ? kernels::F64ToF16(AsDouble(v)) : kernels::F64ToBF16(AsDouble(v)));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kI32: {
      const auto x = static_cast<int32_t>(clamp(INT32_MIN, INT32_MAX));
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::kI64: {
      const int64_t x = v.type == Type::kI64    ? v.i
                        : v.type == Type::kBool ? (v.b ? 1 : 0)
                                                : SaturateI64(AsDouble(v));
      std::memcpy(p, &x, 8);
      break;
    }
    case DType::kU8:
      *p = static_cast<uint8_t>(clamp(0, 255));
      break;
    case DType::kBool:
      *p = Convert(v, Type::kBool).b ? 1 : 0;
      break;
  }
}

int64_t Wrap(uint64_t x) { return static_cast<int64_t>(x); }

template <typename T>
T NanWinsMax(T a, T b) {
  return (std::isnan(a) || a > b) ? a : b;
}
template <typename T>
T NanWinsMin(T a, T b) {
  return (std::isnan(a) || a < b) ? a : b;
}

Value Arithmetic(BinaryOp op, const Value& a, const Value& b) {
  Value r = Make(a.type);
  if (a.type == Type::kI64) {
    const auto x = static_cast<uint64_t>(a.i), y = static_cast<uint64_t>(b.i);
    switch (op) {
      case BinaryOp::kAdd:
        r.i = Wrap(x + y);
        break;
      case BinaryOp::kSub:
        r.i = Wrap(x - y);
        break;
      case BinaryOp::kMul:
        r.i = Wrap(x * y);
        break;
      case BinaryOp::kDiv:
        r.i = b.i == 0 ? 0 : b.i == -1 ? Wrap(0 - x) : a.i / b.i;
        break;
      case BinaryOp::kMod:
        r.i = b.i == 0 || b.i == -1 ? 0 : a.i % b.i;
        break;
      default:
        break;
    }
    return r;
  }
  auto apply = [&](auto x, auto y) {
    switch (op) {
      case BinaryOp::kAdd:
        return x + y;
      case BinaryOp::kSub:
        return x - y;
      case BinaryOp::kMul:
        return x * y;
      case BinaryOp::kDiv:
        return x / y;
      default:
        return static_cast<decltype(x)>(std::fmod(x, y));
    }
  };
  if (a.type == Type::kF32) {
    r.f = apply(a.f, b.f);
  } else {
    r.d = apply(a.d, b.d);
  }
  return r;
}

bool Compared(BinaryOp op, const Value& a, const Value& b) {
  auto cmp = [&](auto x, auto y) {
    switch (op) {
      case BinaryOp::kLt:
        return x < y;
      case BinaryOp::kLe:
        return x <= y;
      case BinaryOp::kGt:
        return x > y;
      case BinaryOp::kGe:
        return x >= y;
      case BinaryOp::kEq:
        return x == y;
      default:
        return x != y;
    }
  };
  switch (a.type) {
    case Type::kBool:
      return cmp(a.b, b.b);
    case Type::kI64:
      return cmp(a.i, b.i);
    case Type::kF32:
      return cmp(a.f, b.f);
    case Type::kF64:
      return cmp(a.d, b.d);
  }
  return false;
}

// The C library's functions in the precision of T (no promotion to double on the way).
float Exp(float x) { return expf(x); }
double Exp(double x) { return exp(x); }
float Log(float x) { return logf(x); }
double Log(double x) { return log(x); }
float Sqrt(float x) { return sqrtf(x); }
double Sqrt(double x) { return sqrt(x); }
float Erf(float x) { return erff(x); }
double Erf(double x) { return erf(x); }
float Tanh(float x) { return tanhf(x); }
double Tanh(double x) { return tanh(x); }
float Pow(float x, float y) { return powf(x, y); }
double Pow(double x, double y) { return pow(x, y); }

// The C library function `name` in T's precision: namef for float, name for double.
#define TESSERA_LIBM(Name, name)             \
  float Name(float x) { return name##f(x); } \
  double Name(double x) { return name(x); }
TESSERA_LIBM(Sin, sin)
TESSERA_LIBM(Cos, cos)
TESSERA_LIBM(Tan, tan)
TESSERA_LIBM(Asin, asin)
TESSERA_LIBM(Acos, acos)
TESSERA_LIBM(Atan, atan)
TESSERA_LIBM(Sinh, sinh)
TESSERA_LIBM(Cosh, cosh)
TESSERA_LIBM(Asinh, asinh)
TESSERA_LIBM(Acosh, acosh)
TESSERA_LIBM(Atanh, atanh)
TESSERA_LIBM(Log10, log10)
TESSERA_LIBM(Log2, log2)
TESSERA_LIBM(Log1p, log1p)
TESSERA_LIBM(Exp2, exp2)
TESSERA_LIBM(Expm1, expm1)
TESSERA_LIBM(Cbrt, cbrt)
TESSERA_LIBM(Ceil, ceil)
TESSERA_LIBM(Floor, floor)
TESSERA_LIBM(Trunc, trunc)
TESSERA_LIBM(Rint, rint)
#undef TESSERA_LIBM
float Atan2(float y, float x) { return atan2f(y, x); }
double Atan2(double y, double x) { return atan2(y, x); }
float Hypot(float x, float y) { return hypotf(x, y); }
double Hypot(double x, double y) { return hypot(x, y); }
float Copysign(float x, float y) { return copysignf(x, y); }
double Copysign(double x, double y) { return copysign(x, y); }

// The bit operations, from their definition (docs/kernels.md): a count outside 0..63 shifts
// every bit out.
int64_t ShiftLeft(int64_t a, int64_t n) {
  if (n < 0 || n >= 64) return 0;
  return Wrap(static_cast<uint64_t>(a) << n);
}
int64_t ShiftRight(int64_t a, int64_t n) {
  if (n < 0 || n >= 64) return a < 0 ? -1 : 0;
  // floor(a / 2^n), exactly: arithmetic shift.
  if (n == 63) return a < 0 ? -1 : 0;
  const int64_t p = int64_t{1} << n;
  return a >= 0 ? a / p : -((-(a + 1)) / p) - 1;
}

bool Predicate(Func f, double x) {
  switch (f) {
    case Func::kIsnan:
      return std::isnan(x);
    case Func::kIsinf:
      return std::isinf(x);
    default:
      return std::isfinite(x);
  }
}

template <typename T>
T FloatCall(Func f, T x, T y) {
  switch (f) {
    case Func::kAbs:
      return std::fabs(x);
    case Func::kExp:
      return Exp(x);
    case Func::kLog:
      return Log(x);
    case Func::kSqrt:
      return Sqrt(x);
    case Func::kRsqrt:
      return T(1) / Sqrt(x);
    case Func::kRelu:
      return x < T(0) ? T(0) : x;
    case Func::kGelu:  // the catalog's formulas (kernels/cuda/elementwise.cu)
      return T(0.5) * x * (T(1) + Erf(x * T(0.70710678118654752440)));
    case Func::kSigmoid:
      return T(1) / (T(1) + Exp(-x));
    case Func::kTanh:
      return Tanh(x);
    case Func::kPow:
      return Pow(x, y);
    case Func::kMaximum:
      return NanWinsMax(x, y);
    case Func::kMinimum:
      return NanWinsMin(x, y);
    case Func::kSin:
      return Sin(x);
    case Func::kCos:
      return Cos(x);
    case Func::kTan:
      return Tan(x);
    case Func::kArcsin:
      return Asin(x);
    case Func::kArccos:
      return Acos(x);
    case Func::kArctan:
      return Atan(x);
    case Func::kSinh:
      return Sinh(x);
    case Func::kCosh:
      return Cosh(x);
    case Func::kArcsinh:
      return Asinh(x);
    case Func::kArccosh:
      return Acosh(x);
    case Func::kArctanh:
      return Atanh(x);
    case Func::kLog10:
      return Log10(x);
    case Func::kLog2:
      return Log2(x);
    case Func::kLog1p:
      return Log1p(x);
    case Func::kExp2:
      return Exp2(x);
    case Func::kExpm1:
      return Expm1(x);
    case Func::kCbrt:
      return Cbrt(x);
    case Func::kCeil:
      return Ceil(x);
    case Func::kFloor:
      return Floor(x);
    case Func::kTrunc:
      return Trunc(x);
    case Func::kRound:
      return Rint(x);
    case Func::kArctan2:
      return Atan2(x, y);
    case Func::kHypot:
      return Hypot(x, y);
    case Func::kCopysign:
      return Copysign(x, y);
    case Func::kIsnan:
    case Func::kIsinf:
    case Func::kIsfinite:
      break;  // bool results: Predicate
  }
  return x;
}

// Evaluates the nodes of `used` in order.
struct Evaluation {
  const Program& program;
  const kernels::Plan& plan;
  std::vector<Value> values;

  Evaluation(const Program& p, const kernels::Plan& pl) : program(p), plan(pl) {
    values.resize(p.nodes.size());
  }

  // `input(k)`: input k's element; `reduced`, `count`: a reduction's post-expression.
  template <typename InputFn>
  void Run(const std::vector<bool>& used, InputFn input, const Value& reduced, int64_t count) {
    for (size_t at = 0; at < program.nodes.size(); ++at) {
      if (!used[at]) continue;
      const Node& n = program.nodes[at];
      auto arg = [&](size_t i) -> const Value& { return values[static_cast<size_t>(n.args[i])]; };
      Value v = Make(n.type);
      switch (n.kind) {
        case NodeKind::kInput:
          v = Convert(input(n.index), n.type);
          break;
        case NodeKind::kParam: {
          const auto& p = program.definition.params[static_cast<size_t>(n.index)];
          Value raw = Make(p.kind == ScalarKind::kInt ? Type::kI64 : Type::kF64);
          if (p.kind == ScalarKind::kInt) {
            raw.i = kernels::AttrInt(plan.attrs, p.name);
          } else {
            raw.d = kernels::AttrFloat(plan.attrs, p.name);
          }
          v = Convert(raw, n.type);
          break;
        }
        case NodeKind::kConst:
          v.b = n.i != 0;
          v.i = n.i;
          v.f = static_cast<float>(n.f);
          v.d = n.f;
          break;
        case NodeKind::kUnary:
          if (static_cast<UnaryOp>(n.op) == UnaryOp::kNot) {
            v.b = !arg(0).b;
          } else if (static_cast<UnaryOp>(n.op) == UnaryOp::kBitNot) {
            v.i = Wrap(~uint64_t{0} - static_cast<uint64_t>(arg(0).i));  // -1 - a
          } else if (n.type == Type::kI64) {
            v.i = Wrap(0 - static_cast<uint64_t>(arg(0).i));
          } else {
            v.f = -arg(0).f;
            v.d = -arg(0).d;
          }
          break;
        case NodeKind::kBinary: {
          const auto op = static_cast<BinaryOp>(n.op);
          if (op == BinaryOp::kAnd) {
            v.b = arg(0).b && arg(1).b;
          } else if (op == BinaryOp::kOr) {
            v.b = arg(0).b || arg(1).b;
          } else if (op == BinaryOp::kBitAnd) {
            v.i = Wrap(static_cast<uint64_t>(arg(0).i) & static_cast<uint64_t>(arg(1).i));
          } else if (op == BinaryOp::kBitOr) {
            v.i = Wrap(static_cast<uint64_t>(arg(0).i) | static_cast<uint64_t>(arg(1).i));
          } else if (op == BinaryOp::kBitXor) {
            v.i = Wrap(static_cast<uint64_t>(arg(0).i) ^ static_cast<uint64_t>(arg(1).i));
          } else if (op == BinaryOp::kShl) {
            v.i = ShiftLeft(arg(0).i, arg(1).i);
          } else if (op == BinaryOp::kShr) {
            v.i = ShiftRight(arg(0).i, arg(1).i);
          } else if (op >= BinaryOp::kLt) {
            v.b = Compared(op, arg(0), arg(1));
          } else {
            v = Arithmetic(op, arg(0), arg(1));
          }
          break;
        }
        case NodeKind::kCall: {
          const auto f = static_cast<Func>(n.op);
          const Value& x = arg(0);
          const Value y = n.args.size() > 1 ? arg(1) : x;
          if (n.type == Type::kBool) {  // a predicate of a float
            v.b = Predicate(f, x.type == Type::kF32 ? static_cast<double>(x.f) : x.d);
          } else if (n.type == Type::kI64) {
            v.i = f == Func::kAbs       ? (x.i < 0 ? Wrap(0 - static_cast<uint64_t>(x.i)) : x.i)
                  : f == Func::kMaximum ? std::max(x.i, y.i)
                                        : std::min(x.i, y.i);
          } else if (n.type == Type::kF32) {
            v.f = FloatCall<float>(f, x.f, y.f);
          } else {
            v.d = FloatCall<double>(f, x.d, y.d);
          }
          break;
        }
        case NodeKind::kWhere:
          v = arg(0).b ? arg(1) : arg(2);
          break;
        case NodeKind::kCast:
          v = Convert(arg(0), n.type);
          break;
        case NodeKind::kReduced:
          v = Convert(reduced, n.type);
          break;
        case NodeKind::kCount: {
          Value c = Make(Type::kI64);
          c.i = count;
          v = Convert(c, n.type);
          break;
        }
      }
      values[at] = v;
    }
  }
};

std::vector<bool> Reach(const Program& program, std::vector<int32_t> roots) {
  std::vector<bool> used(program.nodes.size(), false);
  while (!roots.empty()) {
    const int32_t at = roots.back();
    roots.pop_back();
    if (used[static_cast<size_t>(at)]) continue;
    used[static_cast<size_t>(at)] = true;
    for (int32_t a : program.nodes[static_cast<size_t>(at)].args) roots.push_back(a);
  }
  return used;
}

// Offsets of an element of `shape` (its multi-index) into each input (numpy broadcasting).
std::vector<int64_t> InputOffsets(const kernels::Plan& plan, const Shape& shape,
                                  const std::vector<int64_t>& index) {
  std::vector<int64_t> offsets;
  for (const kernels::TensorMeta& in : plan.inputs) {
    int64_t offset = 0, stride = 1;
    for (size_t j = in.shape.size(); j-- > 0;) {
      const size_t d = shape.size() - in.shape.size() + j;
      if (in.shape[j] != 1) offset += index[d] * stride;
      stride *= in.shape[j];
    }
    offsets.push_back(offset);
  }
  return offsets;
}

std::vector<int64_t> Unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = i % shape[d];
    i /= shape[d];
  }
  return index;
}

// Whether `a` (index ia) beats `b` for argmax (`max`) or argmin: NaN first, ties to the first.
bool Better(const Value& a, int64_t ia, const Value& b, int64_t ib, bool max) {
  if (ib < 0) return true;
  const double x = AsDouble(a), y = AsDouble(b);
  if (a.type == Type::kI64) {
    if (a.i != b.i) return max ? a.i > b.i : a.i < b.i;
    return ia < ib;
  }
  const bool nx = std::isnan(x), ny = std::isnan(y);
  if (nx != ny) return nx;
  if (!nx && x != y) return max ? x > y : x < y;
  return ia < ib;
}

Value Combined(Combine c, const Value& acc, const Value& v) {
  Value r = acc;
  switch (acc.type) {
    case Type::kI64:
      if (c == Combine::kSum) r.i = Wrap(static_cast<uint64_t>(acc.i) + static_cast<uint64_t>(v.i));
      if (c == Combine::kProd)
        r.i = Wrap(static_cast<uint64_t>(acc.i) * static_cast<uint64_t>(v.i));
      if (c == Combine::kMax) r.i = std::max(acc.i, v.i);
      if (c == Combine::kMin) r.i = std::min(acc.i, v.i);
      break;
    case Type::kBool:
      r.b = c == Combine::kMax ? (acc.b || v.b) : (acc.b && v.b);
      break;
    case Type::kF32:
    case Type::kF64: {
      auto f = [&](auto a, auto b) {
        switch (c) {
          case Combine::kSum:
            return a + b;
          case Combine::kProd:
            return a * b;
          case Combine::kMax:
            return std::isnan(a) ? a : (std::isnan(b) || b > a) ? b : a;
          default:
            return std::isnan(a) ? a : (std::isnan(b) || b < a) ? b : a;
        }
      };
      if (acc.type == Type::kF32) {
        r.f = f(acc.f, v.f);
      } else {
        r.d = f(acc.d, v.d);
      }
      break;
    }
  }
  return r;
}

Value Identity(Combine c, Type t) {
  Value v = Make(t);
  const double inf = std::numeric_limits<double>::infinity();
  const double x = c == Combine::kSum    ? 0
                   : c == Combine::kProd ? 1
                   : c == Combine::kMax  ? -inf
                                         : inf;
  v.f = static_cast<float>(x);
  v.d = x;
  v.i = c == Combine::kSum    ? 0
        : c == Combine::kProd ? 1
        : c == Combine::kMax  ? INT64_MIN
                              : INT64_MAX;
  v.b = c == Combine::kMin;
  return v;
}

// Expected outputs, and per element how far a float sum or product may be off.
struct Expected {
  std::vector<HostTensor> values;
  std::vector<double> tolerance;  // output 0's elements (reductions only)
};

Expected Evaluate(const kernels::Plan& plan, const std::vector<HostTensor>& inputs) {
  const Program& program = plan.user->program;
  Expected e;
  for (const kernels::TensorMeta& m : plan.outputs) e.values.emplace_back(m.dtype, m.shape);
  Shape shape;
  for (const auto& in : plan.inputs) shape = *kernels::BroadcastShapes(shape, in.shape);
  Evaluation eval(program, plan);
  if (!program.reduction) {
    const std::vector<bool> used = Reach(program, program.results);
    const int64_t n = kernels::CheckedNumElements(shape);
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<int64_t> offsets = InputOffsets(plan, shape, Unravel(i, shape));
      eval.Run(
          used,
          [&](int k) {
            return Load(inputs[static_cast<size_t>(k)], offsets[static_cast<size_t>(k)]);
          },
          Value{}, 0);
      for (size_t o = 0; o < program.results.size(); ++o) {
        Store(eval.values[static_cast<size_t>(program.results[o])], e.values[o], i);
      }
    }
    return e;
  }
  const auto& red = *program.reduction;
  const bool arg = red.combine == Combine::kArgmin || red.combine == Combine::kArgmax;
  std::vector<bool> reduced(shape.size(), kernels::AttrInts(plan.attrs, "axes").empty());
  for (int64_t a : kernels::AttrInts(plan.attrs, "axes")) {
    reduced[static_cast<size_t>(a < 0 ? a + static_cast<int64_t>(shape.size()) : a)] = true;
  }
  Shape kept_shape, reduced_shape;
  for (size_t d = 0; d < shape.size(); ++d)
    (reduced[d] ? reduced_shape : kept_shape).push_back(shape[d]);
  const int64_t outputs = kernels::CheckedNumElements(kept_shape);
  const int64_t count = kernels::CheckedNumElements(reduced_shape);
  const std::vector<bool> map = Reach(program, {red.map});
  const std::vector<bool> post = Reach(program, program.results);
  const Type acc_type = red.accumulate;
  e.tolerance.assign(static_cast<size_t>(outputs), 0);
  for (int64_t o = 0; o < outputs; ++o) {
    const std::vector<int64_t> kept = Unravel(o, kept_shape);
    Value acc = Identity(red.combine, acc_type);
    Value best;
    int64_t best_index = -1;
    double magnitude = 0, product = 1;
    for (int64_t r = 0; r < count; ++r) {
      const std::vector<int64_t> part = Unravel(r, reduced_shape);
      std::vector<int64_t> index(shape.size());
      size_t ki = 0, ri = 0;
      for (size_t d = 0; d < shape.size(); ++d) index[d] = reduced[d] ? part[ri++] : kept[ki++];
      const std::vector<int64_t> offsets = InputOffsets(plan, shape, index);
      eval.Run(
          map,
          [&](int k) {
            return Load(inputs[static_cast<size_t>(k)], offsets[static_cast<size_t>(k)]);
          },
          Value{}, 0);
      const Value v = eval.values[static_cast<size_t>(red.map)];
      if (arg) {
        if (Better(v, r, best, best_index, red.combine == Combine::kArgmax)) {
          best = v;
          best_index = r;
        }
      } else {
        const Value c = Convert(v, acc_type);
        acc = Combined(red.combine, acc, c);
        magnitude += std::fabs(AsDouble(c));
        product *= std::fabs(AsDouble(c));
      }
    }
    Value result = acc;
    if (arg) {
      result = Make(Type::kI64);
      result.i = best_index < 0 ? 0 : best_index;
    }
    eval.Run(
        post, [&](int) { return Value{}; }, result, count);
    const Value out = eval.values[static_cast<size_t>(program.results[0])];
    Store(out, e.values[0], o);
    // Another order of a float sum or product rounds differently: bound the accumulated error
    // and see how far the post-expression moves with it.
    if (!arg && IsFloat(acc_type) &&
        (red.combine == Combine::kSum || red.combine == Combine::kProd)) {
      const double eps = acc_type == Type::kF32 ? 0x1p-24 : 0x1p-53;
      const double bound = (static_cast<double>(count) + 2) * eps *
                               (red.combine == Combine::kSum ? magnitude : product) +
                           std::numeric_limits<float>::min();
      double worst = 0;
      for (double sign : {-1.0, 1.0}) {
        Value moved = acc;
        moved.f = static_cast<float>(static_cast<double>(acc.f) + sign * bound);
        moved.d = acc.d + sign * bound;
        eval.Run(
            post, [&](int) { return Value{}; }, moved, count);
        worst = std::max(worst,
                         std::fabs(AsDouble(eval.values[static_cast<size_t>(program.results[0])]) -
                                   AsDouble(out)));
      }
      e.tolerance[static_cast<size_t>(o)] = worst;
    }
  }
  return e;
}

}  // namespace

std::vector<HostTensor> Reference(const kernels::Plan& plan,
                                  const std::vector<HostTensor>& inputs) {
  return Evaluate(plan, inputs).values;
}

std::string Compare(const kernels::Plan& plan, const std::vector<HostTensor>& inputs,
                    const std::vector<HostTensor>& expected, const std::vector<HostTensor>& got) {
  const Expected e = Evaluate(plan, inputs);
  if (got.size() != expected.size()) return "a different number of outputs";
  for (size_t o = 0; o < got.size(); ++o) {
    const HostTensor& x = expected[o];
    const HostTensor& y = got[o];
    if (x.meta != y.meta) return absl::StrCat("output ", o, " has another shape or dtype");
    const size_t esize = kernels::DTypeSize(x.meta.dtype);
    for (int64_t i = 0; i < x.size(); ++i) {
      const bool same_bits =
          std::memcmp(x.bytes.data() + i * static_cast<int64_t>(esize),
                      y.bytes.data() + i * static_cast<int64_t>(esize), esize) == 0;
      if (same_bits) continue;
      const double a = x.Get(i), b = y.Get(i);
      if (kernels::IsFloating(x.meta.dtype)) {
        if (std::isnan(a) && std::isnan(b)) continue;
        if (std::isinf(a) || std::isinf(b)) {
          return absl::StrCat("output ", o, " (", kernels::MetaString(x.meta), ") element ", i,
                              ": expected ", a, ", got ", b);
        }
        double tolerance = o == 0 && !e.tolerance.empty() ? e.tolerance[static_cast<size_t>(i)] : 0;
        if (tolerance > 0) tolerance += kernels::UlpOf(x.meta.dtype, a);  // the final rounding
        if (tolerance > 0 && std::fabs(a - b) <= tolerance) continue;
      } else if (o == 0 && !e.tolerance.empty() && e.tolerance[static_cast<size_t>(i)] > 0) {
        // A float sum or product stored to an integer: the truncation may land either side.
        if (std::fabs(a - b) <= 1 + e.tolerance[static_cast<size_t>(i)]) continue;
      }
      return absl::StrCat("output ", o, " (", kernels::MetaString(x.meta), ") element ", i,
                          ": expected ", a, ", got ", b);
    }
  }
  return "";
}

}  // namespace tessera::testing
