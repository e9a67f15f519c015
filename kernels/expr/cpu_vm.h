#ifndef TESSERA_KERNELS_EXPR_CPU_VM_H_
#define TESSERA_KERNELS_EXPR_CPU_VM_H_

// Private to kernels/expr/cpu_program.cc: the register machine a CpuProgram runs. A register
// (a "slot") holds a chunk of values of one compute type (bool as uint8_t, int64_t, float,
// double); an instruction is one tight loop over a chunk; loads and stores convert between a
// tensor's dtype and its compute type; folds combine a chunk of map values into a reduction's
// accumulators. The scalar meaning of everything here is kernels/expr/semantics.h.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "Eigen/Core"
#include "kernels/cpu/element.h"
#include "kernels/dtype.h"
#include "kernels/expr/ast.h"
#include "kernels/expr/semantics.h"

// On x86-64 the chunk loops are compiled twice, for SSE2 and for AVX2, and the dynamic linker
// picks one by the CPU (GCC's function multi-versioning): twice the lanes where AVX2 exists.
// Neither uses FMA, so both compute the same bits.
// (A build may define TESSERA_EXPR_LOOP empty to keep only the baseline. Clang builds, the
// fuzzers', keep only the baseline: clang 14 cannot multi-version function templates.
// ThreadSanitizer builds too: the dynamic linker runs each clone's resolver while it
// relocates the executable, before TSan's runtime has started, and the instrumented resolver
// crashes there.)
#if !defined(TESSERA_EXPR_LOOP) && defined(__x86_64__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define TESSERA_EXPR_LOOP [[gnu::target_clones("avx2", "default")]]
#elif !defined(TESSERA_EXPR_LOOP)
#define TESSERA_EXPR_LOOP
#endif

namespace tessera::kernels::expr::vm {

namespace sem = semantics;

// ---- compute types -------------------------------------------------------------------------

template <Type T>
struct RegOf;
template <>
struct RegOf<Type::kBool> {
  using type = uint8_t;
};
template <>
struct RegOf<Type::kI64> {
  using type = int64_t;
};
template <>
struct RegOf<Type::kF32> {
  using type = float;
};
template <>
struct RegOf<Type::kF64> {
  using type = double;
};
template <Type T>
using Reg = typename RegOf<T>::type;

template <typename T>
struct Tag {
  using type = T;
};

/// Calls `f(Tag<C>{})` with C the C++ type of `type`'s registers; `fallback` for a value
/// outside the enum.
template <typename F, typename R>
R WithType(Type type, F&& f, R fallback) {
  switch (type) {
    case Type::kBool:
      return f(Tag<uint8_t>{});
    case Type::kI64:
      return f(Tag<int64_t>{});
    case Type::kF32:
      return f(Tag<float>{});
    case Type::kF64:
      return f(Tag<double>{});
  }
  return fallback;
}

// ---- instructions --------------------------------------------------------------------------

/// What an instruction sees: the slots' current chunk pointers and the uniform leaf values
/// (constants, parameters, the reduced count) as bit patterns of their compute type.
struct Frame {
  void* const* slots;
  const uint64_t* cells;
};

struct Instr;
using InstrFn = void (*)(const Instr&, const Frame&, int64_t n);

/// dst = fn(a, b, c) over n elements; for a fill, `a` is the cell. dst never aliases an
/// argument (the allocator frees arguments only after choosing dst).
struct Instr {
  InstrFn fn = nullptr;
  int32_t dst = 0, a = 0, b = 0, c = 0;
};

template <typename T>
T* SlotOf(const Frame& f, int32_t slot) {
  return static_cast<T*>(f.slots[slot]);
}

/// `m ? a : b` on floats as bit operations: GCC does not if-convert a float select while
/// floating-point traps are modelled (-ftrapping-math), which would keep its loop scalar.
template <typename T>
T Select(bool m, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return m ? a : b;
  } else {
    using U = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
    const U mask = U(0) - static_cast<U>(m);
    return std::bit_cast<T>((std::bit_cast<U>(a) & mask) | (std::bit_cast<U>(b) & ~mask));
  }
}

template <typename In, typename Out, typename Op>
TESSERA_EXPR_LOOP void UnaryLoop(const Instr& in, const Frame& f, int64_t n) {
  const In* __restrict a = SlotOf<const In>(f, in.a);
  Out* __restrict d = SlotOf<Out>(f, in.dst);
  for (int64_t i = 0; i < n; ++i) d[i] = Op::Apply(a[i]);
}

template <typename In, typename Out, typename Op>
TESSERA_EXPR_LOOP void BinaryLoop(const Instr& in, const Frame& f, int64_t n) {
  const In* __restrict a = SlotOf<const In>(f, in.a);
  const In* __restrict b = SlotOf<const In>(f, in.b);
  Out* __restrict d = SlotOf<Out>(f, in.dst);
  for (int64_t i = 0; i < n; ++i) d[i] = Op::Apply(a[i], b[i]);
}

template <typename T>
TESSERA_EXPR_LOOP void WhereLoop(const Instr& in, const Frame& f, int64_t n) {
  const uint8_t* __restrict c = SlotOf<const uint8_t>(f, in.a);
  const T* __restrict x = SlotOf<const T>(f, in.b);
  const T* __restrict y = SlotOf<const T>(f, in.c);
  T* __restrict d = SlotOf<T>(f, in.dst);
  for (int64_t i = 0; i < n; ++i) d[i] = Select(c[i] != 0, x[i], y[i]);
}

template <typename T>
void FillLoop(const Instr& in, const Frame& f, int64_t n) {
  T v;
  std::memcpy(&v, &f.cells[in.a], sizeof(T));
  std::fill_n(SlotOf<T>(f, in.dst), n, v);
}

// ---- f32 exp, vectorizable ----------------------------------------------------------------
//
// Cody-Waite reduction by ln 2 and Cephes' expf polynomial, in plain arithmetic (no calls, no
// branches) so that GCC vectorizes the loops. Within 1 ulp of the exact value for every float
// (checked exhaustively), inside the catalog's exp bound (2 ulps, kernels/accuracy.h).

/// x = n ln 2 + r: e^r (a polynomial), and 1.5 * 2^23 + n, whose low mantissa bits hold n.
struct ExpParts {
  float p;
  float t;
};
inline ExpParts ExpReduce(float x) {
  const float t = x * 1.44269504088896341f + 12582912.0f;  // rounds x / ln 2 to an integer
  const float n = t - 12582912.0f;
  float r = x - n * 0.693359375f;  // n * ln2_hi is exact (ln2_hi has 9 bits)
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return {p * (r * r) + r + 1.0f, t};
}

/// e^x for x in [kExpFastLo, kExpFastHi] (normal results); anything for other x.
inline float ExpF32Fast(float x) {
  const ExpParts e = ExpReduce(x);
  // (bits(t) + 127) << 23 is 2^n: an exact scaling.
  return e.p * std::bit_cast<float>((std::bit_cast<uint32_t>(e.t) + 127u) << 23);
}
inline constexpr float kExpFastLo = -87.0f;
inline constexpr float kExpFastHi = 88.0f;

/// e^x for every x: overflow gives inf, underflow subnormals (rounded once) or 0, NaN stays.
inline float ExpF32(float x) {
  if (x != x) return x;
  const ExpParts e = ExpReduce(std::clamp(x, -104.0f, 88.8f));  // beyond: 0 or inf anyway
  const auto n = static_cast<int32_t>(std::bit_cast<uint32_t>(e.t) - 0x4B400000u);
  const int32_t n1 = n / 2;  // 2^n as two normal factors; e.p * 2^n1 is exact
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(n - n1 + 127) << 23);
  return e.p * s1 * s2;
}

/// d[i] = e^(sign * a[i]) (sigmoid: 1 / (1 + e^-a[i])): the fast form over the chunk, then
/// the few elements outside its range again.
template <bool kSigmoid>
TESSERA_EXPR_LOOP void ExpF32Run(const float* __restrict a, float* __restrict d, int64_t n) {
  constexpr float kSign = kSigmoid ? -1.0f : 1.0f;
  uint32_t outside = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = kSign * a[i];
    const float e = ExpF32Fast(x);
    d[i] = kSigmoid ? 1.0f / (1.0f + e) : e;
    outside |= static_cast<uint32_t>(!((x >= kExpFastLo) & (x <= kExpFastHi)));
  }
  if (outside == 0) return;
  for (int64_t i = 0; i < n; ++i) {
    const float x = kSign * a[i];
    if (!(x >= kExpFastLo && x <= kExpFastHi)) {
      const float e = ExpF32(x);
      d[i] = kSigmoid ? 1.0f / (1.0f + e) : e;
    }
  }
}

template <typename T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// f32: ExpF32; f64: Eigen's vectorized exp and log, corrected as the catalog's kernels do,
// so both have the accuracy kernels/accuracy.h documents.
template <typename T>
void ExpLoop(const Instr& in, const Frame& f, int64_t n) {
  const T* __restrict a = SlotOf<const T>(f, in.a);
  T* __restrict d = SlotOf<T>(f, in.dst);
  if constexpr (std::is_same_v<T, float>) {
    ExpF32Run<false>(a, d, n);
  } else {
    ArrayMap<T>(d, n) = ConstArrayMap<T>(a, n).exp();
    // Eigen clamps its argument near the underflow threshold; redo those elements exactly.
    for (int64_t i = 0; i < n; ++i) {
      if (a[i] < T(-707)) d[i] = std::exp(a[i]);
    }
  }
}

template <typename T>
void LogLoop(const Instr& in, const Frame& f, int64_t n) {
  const T* a = SlotOf<const T>(f, in.a);
  T* d = SlotOf<T>(f, in.dst);
  ArrayMap<T>(d, n) = ConstArrayMap<T>(a, n).log();
  // Eigen treats subnormal arguments as the smallest normal; redo those exactly.
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] > T(0) && a[i] < std::numeric_limits<T>::min()) d[i] = std::log(a[i]);
  }
}

/// 1 / (1 + exp(-x)), the catalog's formula (Eigen's logistic is less accurate).
template <typename T>
void SigmoidLoop(const Instr& in, const Frame& f, int64_t n) {
  const T* __restrict a = SlotOf<const T>(f, in.a);
  T* __restrict d = SlotOf<T>(f, in.dst);
  if constexpr (std::is_same_v<T, float>) {
    ExpF32Run<true>(a, d, n);
  } else {
    ArrayMap<T>(d, n) = (T(1) + (-ConstArrayMap<T>(a, n)).exp()).inverse();
  }
}

struct NegOp {
  template <typename T>
  static T Apply(T x) {
    if constexpr (std::is_integral_v<T>) {
      return sem::NegI64(x);
    } else {
      return -x;
    }
  }
};
struct NotOp {
  static uint8_t Apply(uint8_t x) { return x ^ 1; }  // registers hold 0 or 1
};
struct AddOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return sem::AddI64(a, b);
    } else {
      return a + b;
    }
  }
};
struct SubOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return sem::SubI64(a, b);
    } else {
      return a - b;
    }
  }
};
struct MulOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return sem::MulI64(a, b);
    } else {
      return a * b;
    }
  }
};
struct DivOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return sem::DivI64(a, b);
    } else {
      return a / b;
    }
  }
};
struct ModOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return sem::ModI64(a, b);
    } else {
      return std::fmod(a, b);
    }
  }
};
struct LtOp {
  template <typename T>
  static uint8_t Apply(T a, T b) {
    return a < b;
  }
};
struct LeOp {
  template <typename T>
  static uint8_t Apply(T a, T b) {
    return a <= b;
  }
};
struct GtOp {
  template <typename T>
  static uint8_t Apply(T a, T b) {
    return a > b;
  }
};
struct GeOp {
  template <typename T>
  static uint8_t Apply(T a, T b) {
    return a >= b;
  }
};
struct EqOp {
  template <typename T>
  static uint8_t Apply(T a, T b) {
    return a == b;
  }
};
struct NeOp {
  template <typename T>
  static uint8_t Apply(T a, T b) {
    return a != b;
  }
};
struct AndOp {
  static uint8_t Apply(uint8_t a, uint8_t b) { return a & b; }
};
struct OrOp {
  static uint8_t Apply(uint8_t a, uint8_t b) { return a | b; }
};
struct AbsOp {
  template <typename T>
  static T Apply(T x) {
    return sem::Abs(x);
  }
};
struct SqrtOp {
  template <typename T>
  static T Apply(T x) {
    return std::sqrt(x);
  }
};
struct RsqrtOp {
  template <typename T>
  static T Apply(T x) {
    return sem::Rsqrt(x);
  }
};
// relu, maximum and minimum as semantics.h defines them, written with Select to vectorize.
struct ReluOp {
  template <typename T>
  static T Apply(T x) {
    return Select(x < T(0), T(0), x);
  }
};
struct GeluOp {
  template <typename T>
  static T Apply(T x) {
    return sem::Gelu(x);
  }
};
struct TanhOp {  // the C library's, as the catalog's tanh
  template <typename T>
  static T Apply(T x) {
    return std::tanh(x);
  }
};
struct PowOp {
  template <typename T>
  static T Apply(T a, T b) {
    return std::pow(a, b);
  }
};
struct MaximumOp {
  template <typename T>
  static T Apply(T a, T b) {
    return Select((a != a) | (a > b), a, b);
  }
};
struct MinimumOp {
  template <typename T>
  static T Apply(T a, T b) {
    return Select((a != a) | (a < b), a, b);
  }
};
// The C library's functions, element by element (the CUDA path calls CUDA's of the same
// names); kernels/accuracy.h bounds both.
#define TESSERA_EXPR_LIBM_OP(Name, function) \
  struct Name {                              \
    template <typename T>                    \
    static T Apply(T x) {                    \
      return std::function(x);               \
    }                                        \
  }
TESSERA_EXPR_LIBM_OP(SinOp, sin);
TESSERA_EXPR_LIBM_OP(CosOp, cos);
TESSERA_EXPR_LIBM_OP(TanOp, tan);
TESSERA_EXPR_LIBM_OP(ArcsinOp, asin);
TESSERA_EXPR_LIBM_OP(ArccosOp, acos);
TESSERA_EXPR_LIBM_OP(ArctanOp, atan);
TESSERA_EXPR_LIBM_OP(SinhOp, sinh);
TESSERA_EXPR_LIBM_OP(CoshOp, cosh);
TESSERA_EXPR_LIBM_OP(ArcsinhOp, asinh);
TESSERA_EXPR_LIBM_OP(ArccoshOp, acosh);
TESSERA_EXPR_LIBM_OP(ArctanhOp, atanh);
TESSERA_EXPR_LIBM_OP(Log10Op, log10);
TESSERA_EXPR_LIBM_OP(Log2Op, log2);
TESSERA_EXPR_LIBM_OP(Log1pOp, log1p);
TESSERA_EXPR_LIBM_OP(Exp2Op, exp2);
TESSERA_EXPR_LIBM_OP(Expm1Op, expm1);
TESSERA_EXPR_LIBM_OP(CbrtOp, cbrt);
TESSERA_EXPR_LIBM_OP(CeilOp, ceil);
TESSERA_EXPR_LIBM_OP(FloorOp, floor);
TESSERA_EXPR_LIBM_OP(TruncOp, trunc);
TESSERA_EXPR_LIBM_OP(RoundOp, rint);  // half to even: the default rounding mode
#undef TESSERA_EXPR_LIBM_OP
struct Arctan2Op {
  template <typename T>
  static T Apply(T y, T x) {
    return std::atan2(y, x);
  }
};
struct HypotOp {
  template <typename T>
  static T Apply(T a, T b) {
    return std::hypot(a, b);
  }
};
struct CopysignOp {
  template <typename T>
  static T Apply(T a, T b) {
    return std::copysign(a, b);
  }
};
struct IsnanOp {
  template <typename T>
  static uint8_t Apply(T x) {
    return x != x;
  }
};
struct IsinfOp {
  template <typename T>
  static uint8_t Apply(T x) {
    return std::fabs(x) == std::numeric_limits<T>::infinity();
  }
};
struct IsfiniteOp {  // false for NaN, which compares false
  template <typename T>
  static uint8_t Apply(T x) {
    return std::fabs(x) <= std::numeric_limits<T>::max();
  }
};
// Bit operations on int64_t (semantics.h: shifts are total).
struct BitNotOp {
  static int64_t Apply(int64_t x) { return ~x; }
};
struct BitAndOp {
  static int64_t Apply(int64_t a, int64_t b) { return a & b; }
};
struct BitOrOp {
  static int64_t Apply(int64_t a, int64_t b) { return a | b; }
};
struct BitXorOp {
  static int64_t Apply(int64_t a, int64_t b) { return a ^ b; }
};
struct ShlOp {
  static int64_t Apply(int64_t a, int64_t b) { return sem::ShlI64(a, b); }
};
struct ShrOp {
  static int64_t Apply(int64_t a, int64_t b) { return sem::ShrI64(a, b); }
};

template <typename To>
struct CastOp {
  template <typename From>
  static To Apply(From x) {
    return sem::Convert<To>(x);
  }
};

// Instruction selection: nullptr where the program asks for an operation on a type that
// ast.h does not define.
template <typename Op, bool kInts>
InstrFn Unary(Type type) {
  switch (type) {
    case Type::kI64:
      return kInts ? &UnaryLoop<int64_t, int64_t, Op> : nullptr;
    case Type::kF32:
      return &UnaryLoop<float, float, Op>;
    case Type::kF64:
      return &UnaryLoop<double, double, Op>;
    case Type::kBool:
      break;
  }
  return nullptr;
}

template <typename Op, bool kInts>
InstrFn Binary(Type type) {
  switch (type) {
    case Type::kI64:
      return kInts ? &BinaryLoop<int64_t, int64_t, Op> : nullptr;
    case Type::kF32:
      return &BinaryLoop<float, float, Op>;
    case Type::kF64:
      return &BinaryLoop<double, double, Op>;
    case Type::kBool:
      break;
  }
  return nullptr;
}

template <typename Op>
InstrFn Compare(Type operands) {
  return WithType(
      operands,
      [](auto tag) -> InstrFn { return &BinaryLoop<typename decltype(tag)::type, uint8_t, Op>; },
      InstrFn{nullptr});
}

inline InstrFn FloatLoop(Type type, InstrFn f32, InstrFn f64) {
  return type == Type::kF32 ? f32 : type == Type::kF64 ? f64 : nullptr;
}

/// An integer-only operation: nullptr unless `type` is kI64.
inline InstrFn IntLoop(Type type, InstrFn i64) { return type == Type::kI64 ? i64 : nullptr; }

/// A predicate of a float argument of type `arg` into a bool (`type`).
template <typename Op>
InstrFn Predicate(Type type, Type arg) {
  if (type != Type::kBool) return nullptr;
  return FloatLoop(arg, &UnaryLoop<float, uint8_t, Op>, &UnaryLoop<double, uint8_t, Op>);
}

/// The loop computing `node` (an operation node) from arguments of type `arg` (its first
/// argument's type, which differs from the node's for comparisons and casts).
inline InstrFn SelectInstr(const Node& node, Type arg) {
  switch (node.kind) {
    case NodeKind::kUnary:
      switch (static_cast<UnaryOp>(node.op)) {
        case UnaryOp::kNeg:
          return Unary<NegOp, true>(node.type);
        case UnaryOp::kNot:
          return node.type == Type::kBool ? &UnaryLoop<uint8_t, uint8_t, NotOp> : nullptr;
        case UnaryOp::kBitNot:
          return IntLoop(node.type, &UnaryLoop<int64_t, int64_t, BitNotOp>);
      }
      return nullptr;
    case NodeKind::kBinary:
      switch (static_cast<BinaryOp>(node.op)) {
        case BinaryOp::kAdd:
          return Binary<AddOp, true>(node.type);
        case BinaryOp::kSub:
          return Binary<SubOp, true>(node.type);
        case BinaryOp::kMul:
          return Binary<MulOp, true>(node.type);
        case BinaryOp::kDiv:
          return Binary<DivOp, true>(node.type);
        case BinaryOp::kMod:
          return Binary<ModOp, true>(node.type);
        case BinaryOp::kLt:
          return Compare<LtOp>(arg);
        case BinaryOp::kLe:
          return Compare<LeOp>(arg);
        case BinaryOp::kGt:
          return Compare<GtOp>(arg);
        case BinaryOp::kGe:
          return Compare<GeOp>(arg);
        case BinaryOp::kEq:
          return Compare<EqOp>(arg);
        case BinaryOp::kNe:
          return Compare<NeOp>(arg);
        case BinaryOp::kAnd:
          return node.type == Type::kBool ? &BinaryLoop<uint8_t, uint8_t, AndOp> : nullptr;
        case BinaryOp::kOr:
          return node.type == Type::kBool ? &BinaryLoop<uint8_t, uint8_t, OrOp> : nullptr;
        case BinaryOp::kBitAnd:
          return IntLoop(node.type, &BinaryLoop<int64_t, int64_t, BitAndOp>);
        case BinaryOp::kBitOr:
          return IntLoop(node.type, &BinaryLoop<int64_t, int64_t, BitOrOp>);
        case BinaryOp::kBitXor:
          return IntLoop(node.type, &BinaryLoop<int64_t, int64_t, BitXorOp>);
        case BinaryOp::kShl:
          return IntLoop(node.type, &BinaryLoop<int64_t, int64_t, ShlOp>);
        case BinaryOp::kShr:
          return IntLoop(node.type, &BinaryLoop<int64_t, int64_t, ShrOp>);
      }
      return nullptr;
    case NodeKind::kCall:
      switch (static_cast<Func>(node.op)) {
        case Func::kAbs:
          return Unary<AbsOp, true>(node.type);
        case Func::kExp:
          return FloatLoop(node.type, &ExpLoop<float>, &ExpLoop<double>);
        case Func::kLog:
          return FloatLoop(node.type, &LogLoop<float>, &LogLoop<double>);
        case Func::kSqrt:
          return Unary<SqrtOp, false>(node.type);
        case Func::kRsqrt:
          return Unary<RsqrtOp, false>(node.type);
        case Func::kRelu:
          return Unary<ReluOp, false>(node.type);
        case Func::kGelu:
          return Unary<GeluOp, false>(node.type);
        case Func::kSigmoid:
          return FloatLoop(node.type, &SigmoidLoop<float>, &SigmoidLoop<double>);
        case Func::kTanh:
          return Unary<TanhOp, false>(node.type);
        case Func::kPow:
          return Binary<PowOp, false>(node.type);
        case Func::kMaximum:
          return Binary<MaximumOp, true>(node.type);
        case Func::kMinimum:
          return Binary<MinimumOp, true>(node.type);
        case Func::kSin:
          return Unary<SinOp, false>(node.type);
        case Func::kCos:
          return Unary<CosOp, false>(node.type);
        case Func::kTan:
          return Unary<TanOp, false>(node.type);
        case Func::kArcsin:
          return Unary<ArcsinOp, false>(node.type);
        case Func::kArccos:
          return Unary<ArccosOp, false>(node.type);
        case Func::kArctan:
          return Unary<ArctanOp, false>(node.type);
        case Func::kSinh:
          return Unary<SinhOp, false>(node.type);
        case Func::kCosh:
          return Unary<CoshOp, false>(node.type);
        case Func::kArcsinh:
          return Unary<ArcsinhOp, false>(node.type);
        case Func::kArccosh:
          return Unary<ArccoshOp, false>(node.type);
        case Func::kArctanh:
          return Unary<ArctanhOp, false>(node.type);
        case Func::kLog10:
          return Unary<Log10Op, false>(node.type);
        case Func::kLog2:
          return Unary<Log2Op, false>(node.type);
        case Func::kLog1p:
          return Unary<Log1pOp, false>(node.type);
        case Func::kExp2:
          return Unary<Exp2Op, false>(node.type);
        case Func::kExpm1:
          return Unary<Expm1Op, false>(node.type);
        case Func::kCbrt:
          return Unary<CbrtOp, false>(node.type);
        case Func::kCeil:
          return Unary<CeilOp, false>(node.type);
        case Func::kFloor:
          return Unary<FloorOp, false>(node.type);
        case Func::kTrunc:
          return Unary<TruncOp, false>(node.type);
        case Func::kRound:
          return Unary<RoundOp, false>(node.type);
        case Func::kIsnan:
          return Predicate<IsnanOp>(node.type, arg);
        case Func::kIsinf:
          return Predicate<IsinfOp>(node.type, arg);
        case Func::kIsfinite:
          return Predicate<IsfiniteOp>(node.type, arg);
        case Func::kArctan2:
          return Binary<Arctan2Op, false>(node.type);
        case Func::kHypot:
          return Binary<HypotOp, false>(node.type);
        case Func::kCopysign:
          return Binary<CopysignOp, false>(node.type);
      }
      return nullptr;
    case NodeKind::kWhere:
      return WithType(
          node.type, [](auto tag) -> InstrFn { return &WhereLoop<typename decltype(tag)::type>; },
          InstrFn{nullptr});
    case NodeKind::kCast:
      return WithType(
          node.type,
          [arg](auto to) -> InstrFn {
            using To = typename decltype(to)::type;
            return WithType(
                arg,
                [](auto from) -> InstrFn {
                  using From = typename decltype(from)::type;
                  return &UnaryLoop<From, To, CastOp<To>>;
                },
                InstrFn{nullptr});
          },
          InstrFn{nullptr});
    case NodeKind::kConst:
    case NodeKind::kParam:
    case NodeKind::kCount:
      return WithType(
          node.type, [](auto tag) -> InstrFn { return &FillLoop<typename decltype(tag)::type>; },
          InstrFn{nullptr});
    case NodeKind::kInput:
    case NodeKind::kReduced:
      break;  // loads, not instructions
  }
  return nullptr;
}

// ---- loads and stores ----------------------------------------------------------------------

/// Converts n elements of a tensor (from element `offset`, `stride` apart; 0 repeats one) to
/// the dtype's compute type at dst.
using LoadFn = void (*)(const void* base, int64_t offset, int64_t stride, void* dst, int64_t n);
/// Converts n compute values at src to the tensor's dtype at element `offset`.
using StoreFn = void (*)(const void* src, void* base, int64_t offset, int64_t n);

template <DType D>
TESSERA_EXPR_LOOP void LoadRun(const void* base, int64_t offset, int64_t stride, void* dst,
                               int64_t n) {
  using E = cpu::Elem<D>;
  using R = Reg<ComputeType(D)>;
  const typename E::Storage* __restrict s = static_cast<const typename E::Storage*>(base) + offset;
  R* __restrict d = static_cast<R*>(dst);
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = sem::Convert<R>(E::Load(s[i]));
  } else if (stride == 0) {
    std::fill_n(d, n, sem::Convert<R>(E::Load(s[0])));
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = sem::Convert<R>(E::Load(s[i * stride]));
  }
}

/// Whether a dtype's storage is its compute type's (a contiguous load may then point the
/// slot at the tensor instead of copying). Not bool: loads normalize stray bytes to 0/1.
constexpr bool LoadsInPlace(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kI64;
}

template <typename R, DType D>
typename cpu::Elem<D>::Storage StoreValue(R v) {
  if constexpr (D == DType::kF32) {
    return sem::Convert<float>(v);
  } else if constexpr (D == DType::kF64) {
    return sem::Convert<double>(v);
  } else if constexpr (D == DType::kF16 || D == DType::kBF16) {
    constexpr bool kHalf = D == DType::kF16;
    if constexpr (std::is_same_v<R, double> || std::is_same_v<R, int64_t>) {
      const double w = static_cast<double>(v);
      return kHalf ? F64ToF16(w) : F64ToBF16(w);
    } else {
      const float w = static_cast<float>(v);
      return kHalf ? F32ToF16(w) : F32ToBF16(w);
    }
  } else if constexpr (D == DType::kI64) {
    return sem::Convert<int64_t>(v);
  } else if constexpr (D == DType::kI32 || D == DType::kU8) {
    using I = typename cpu::Elem<D>::Storage;
    if constexpr (std::is_floating_point_v<R>) {
      return sem::FloatToInt<I>(static_cast<double>(v));
    } else {
      return sem::SaturateInt<I>(static_cast<int64_t>(v));
    }
  } else {
    return v != R(0) ? 1 : 0;
  }
}

template <typename R, DType D>
TESSERA_EXPR_LOOP void StoreRun(const void* src, void* base, int64_t offset, int64_t n) {
  using S = typename cpu::Elem<D>::Storage;
  const R* __restrict s = static_cast<const R*>(src);
  S* __restrict d = static_cast<S*>(base) + offset;
  for (int64_t i = 0; i < n; ++i) d[i] = StoreValue<R, D>(s[i]);
}

inline LoadFn SelectLoad(DType dtype) {
  return cpu::Dispatch(dtype, []<DType D>() -> LoadFn { return &LoadRun<D>; });
}

inline StoreFn SelectStore(Type from, DType to) {
  return WithType(
      from,
      [to](auto tag) -> StoreFn {
        using R = typename decltype(tag)::type;
        return cpu::Dispatch(to, []<DType D>() -> StoreFn { return &StoreRun<R, D>; });
      },
      StoreFn{nullptr});
}

// ---- reductions ----------------------------------------------------------------------------

/// One reduction's running state; which fields a combine uses is its fold's business. Float
/// sums and products accumulate in double (f32 map values add exactly, so a sum of f32 values
/// has the catalog's sum accuracy), with a compensation term for sums.
struct Acc {
  double f = 0;
  double c = 0;
  int64_t i = 0;
  int64_t index = -1;  // argmin/argmax: -1 before the first element
};

/// A combine specialized for its map type and accumulate type.
struct FoldOps {
  Acc init;
  /// Folds n map values (reduced indices first, first + 1, ...) into acc, in order.
  void (*run)(const void* values, int64_t n, int64_t first, Acc& acc);
  /// Folds the state of a later range of the same reduction into acc.
  void (*merge)(Acc& acc, const Acc& later);
  /// Writes the combined value (accumulate type; argmin/argmax: int64_t) to out[i].
  void (*finish)(const Acc& acc, void* out, int64_t i);
};

// Neumaier's compensated addition.
inline void AddCompensated(Acc& acc, double x) {
  const double t = acc.f + x;
  acc.c += std::fabs(acc.f) >= std::fabs(x) ? (acc.f - t) + x : (x - t) + acc.f;
  acc.f = t;
}

template <typename A>
A GetValue(const Acc& acc) {
  if constexpr (std::is_floating_point_v<A>) {
    return static_cast<A>(acc.f);
  } else {
    return static_cast<A>(acc.i);
  }
}
template <typename A>
void SetValue(Acc& acc, A v) {
  if constexpr (std::is_floating_point_v<A>) {
    acc.f = static_cast<double>(v);
  } else {
    acc.i = static_cast<int64_t>(v);
  }
}

template <typename M, typename A, bool kProd>
struct SumFold {
  static constexpr bool kFloat = std::is_floating_point_v<A>;
  static Acc Init() {
    Acc acc;
    acc.f = kProd ? 1 : 0;
    acc.i = kProd ? 1 : 0;
    return acc;
  }
  // Eight independent lanes (a vector of them) per chunk, combined pairwise.
  template <typename L>
  static L Lanes(const M* v, int64_t n) {
    L s[8];
    std::fill_n(s, 8, L(kProd ? 1 : 0));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) s[j] = Step<L>(s[j], v[i + j]);
    }
    for (; i < n; ++i) s[0] = Step<L>(s[0], v[i]);
    return Step2<L>(Step2<L>(Step2<L>(s[0], s[1]), Step2<L>(s[2], s[3])),
                    Step2<L>(Step2<L>(s[4], s[5]), Step2<L>(s[6], s[7])));
  }
  template <typename L>
  static L Step(L s, M x) {
    const A a = sem::Convert<A>(x);
    if constexpr (kFloat) {
      return Step2<L>(s, static_cast<L>(a));
    } else {
      return Step2<L>(s, static_cast<L>(static_cast<int64_t>(a)));
    }
  }
  template <typename L>
  static L Step2(L a, L b) {
    return kProd ? a * b : a + b;  // L is double or uint64_t (wrapping)
  }
  static void Run(const void* values, int64_t n, int64_t, Acc& acc) {
    const M* v = static_cast<const M*>(values);
    if constexpr (kFloat) {
      const double s = Lanes<double>(v, n);
      if constexpr (kProd) {
        acc.f *= s;
      } else {
        AddCompensated(acc, s);
      }
    } else {
      const auto s = static_cast<int64_t>(Lanes<uint64_t>(v, n));
      acc.i = kProd ? sem::MulI64(acc.i, s) : sem::AddI64(acc.i, s);
    }
  }
  static void Merge(Acc& acc, const Acc& later) {
    if constexpr (kFloat && kProd) {
      acc.f *= later.f;
    } else if constexpr (kFloat) {
      AddCompensated(acc, later.f);
      acc.c += later.c;
    } else {
      acc.i = kProd ? sem::MulI64(acc.i, later.i) : sem::AddI64(acc.i, later.i);
    }
  }
  static void Finish(const Acc& acc, void* out, int64_t i) {
    if constexpr (kFloat) {
      // Once the sum is infinite or NaN the compensation is meaningless (inf - inf).
      const double v = kProd || !std::isfinite(acc.f) ? acc.f : acc.f + acc.c;
      static_cast<A*>(out)[i] = static_cast<A>(v);
    } else {
      static_cast<A*>(out)[i] = acc.i;
    }
  }
};

template <typename M, typename A, bool kMax>
struct ExtremeFold {
  static Acc Init() {
    Acc acc;
    if constexpr (std::is_floating_point_v<A>) {
      acc.f =
          kMax ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    } else {
      acc.i = kMax ? std::numeric_limits<int64_t>::lowest() : std::numeric_limits<int64_t>::max();
    }
    return acc;
  }
  static void Run(const void* values, int64_t n, int64_t, Acc& acc) {
    const M* v = static_cast<const M*>(values);
    A best = GetValue<A>(acc);
    for (int64_t i = 0; i < n; ++i) best = sem::CombineExtreme<kMax>(best, sem::Convert<A>(v[i]));
    SetValue(acc, best);
  }
  static void Merge(Acc& acc, const Acc& later) {
    SetValue(acc, sem::CombineExtreme<kMax>(GetValue<A>(acc), GetValue<A>(later)));
  }
  static void Finish(const Acc& acc, void* out, int64_t i) {
    static_cast<A*>(out)[i] = GetValue<A>(acc);
  }
};

template <typename M, bool kMax>
struct ArgFold {
  static Acc Init() { return {}; }
  static void Run(const void* values, int64_t n, int64_t first, Acc& acc) {
    const M* v = static_cast<const M*>(values);
    if (n <= 0) return;
    int64_t i = 0;
    if (acc.index < 0) {
      SetValue(acc, v[0]);
      acc.index = first;
      i = 1;
    }
    M best = GetValue<M>(acc);
    int64_t index = acc.index;
    for (; i < n; ++i) {
      if (sem::ArgReplaces<kMax>(v[i], best)) {
        best = v[i];
        index = first + i;
      }
    }
    SetValue(acc, best);
    acc.index = index;
  }
  static void Merge(Acc& acc, const Acc& later) {
    if (later.index < 0) return;
    if (acc.index < 0 || sem::ArgReplaces<kMax>(GetValue<M>(later), GetValue<M>(acc))) {
      acc = later;
    }
  }
  static void Finish(const Acc& acc, void* out, int64_t i) {
    static_cast<int64_t*>(out)[i] = std::max<int64_t>(acc.index, 0);
  }
};

template <typename Fold>
FoldOps OpsOf() {
  return {Fold::Init(), &Fold::Run, &Fold::Merge, &Fold::Finish};
}

/// The fold for `combine` over map values of type `map` accumulated as `accumulate`; nullopt
/// for a combination ast.h does not define.
inline std::optional<FoldOps> SelectFold(Combine combine, Type map, Type accumulate) {
  using Result = std::optional<FoldOps>;
  if (combine == Combine::kArgmin || combine == Combine::kArgmax) {
    if (accumulate != Type::kI64) return std::nullopt;
    const bool max = combine == Combine::kArgmax;
    return WithType(
        map,
        [max](auto tag) -> Result {
          using M = typename decltype(tag)::type;
          return max ? OpsOf<ArgFold<M, true>>() : OpsOf<ArgFold<M, false>>();
        },
        Result{});
  }
  if (accumulate == Type::kBool) return std::nullopt;
  return WithType(
      map,
      [&](auto map_tag) -> Result {
        using M = typename decltype(map_tag)::type;
        return WithType(
            accumulate,
            [&](auto acc_tag) -> Result {
              using A = typename decltype(acc_tag)::type;
              if constexpr (std::is_same_v<A, uint8_t>) {
                return std::nullopt;
              } else {
                switch (combine) {
                  case Combine::kSum:
                    return OpsOf<SumFold<M, A, false>>();
                  case Combine::kProd:
                    return OpsOf<SumFold<M, A, true>>();
                  case Combine::kMin:
                    return OpsOf<ExtremeFold<M, A, false>>();
                  case Combine::kMax:
                    return OpsOf<ExtremeFold<M, A, true>>();
                  case Combine::kArgmin:
                  case Combine::kArgmax:
                    break;
                }
                return std::nullopt;
              }
            },
            Result{});
      },
      Result{});
}

}  // namespace tessera::kernels::expr::vm

#endif  // TESSERA_KERNELS_EXPR_CPU_VM_H_
