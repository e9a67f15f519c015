// fill, copy, cast, the unary and the broadcasting binary kernels.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/status/status.h"

#include "Eigen/Core"
#include "kernels/cpu/element.h"
#include "kernels/cpu/kernels_internal.h"

namespace tessera::kernels::cpu {
namespace {

// ---- conversions (cast and fill) -----------------------------------------------------------

template <typename To>
To SaturateFromDouble(double v) {
  if (std::isnan(v)) return 0;
  v = std::trunc(v);
  if (v <= static_cast<double>(std::numeric_limits<To>::lowest())) {
    return std::numeric_limits<To>::lowest();
  }
  if (v >= static_cast<double>(std::numeric_limits<To>::max())) {
    return std::numeric_limits<To>::max();
  }
  return static_cast<To>(v);
}

template <typename To>
To SaturateFromInt(int64_t v) {
  if (v < static_cast<int64_t>(std::numeric_limits<To>::lowest())) {
    return std::numeric_limits<To>::lowest();
  }
  if (static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<To>::max()) && v > 0) {
    return std::numeric_limits<To>::max();
  }
  return static_cast<To>(v);
}

// Converts one element of dtype S (already loaded in its compute type) to storage of T.
template <DType S, DType T>
typename Elem<T>::Storage Convert(typename Elem<S>::Compute v) {
  using Out = typename Elem<T>::Storage;
  if constexpr (T == DType::kBool) {
    return v != 0 ? 1 : 0;
  } else if constexpr (kIsFloat<S>) {
    if constexpr (T == DType::kF64) {
      return static_cast<double>(v);
    } else if constexpr (T == DType::kF32) {
      return static_cast<float>(v);
    } else if constexpr (T == DType::kF16) {
      if constexpr (S == DType::kF64) return F64ToF16(v);
      return F32ToF16(static_cast<float>(v));
    } else if constexpr (T == DType::kBF16) {
      if constexpr (S == DType::kF64) return F64ToBF16(v);
      return F32ToBF16(static_cast<float>(v));
    } else {
      return SaturateFromDouble<Out>(static_cast<double>(v));
    }
  } else {  // integer or bool source
    int64_t i = static_cast<int64_t>(v);
    if constexpr (T == DType::kF64) {
      return static_cast<double>(i);
    } else if constexpr (T == DType::kF32) {
      return static_cast<float>(i);
    } else if constexpr (T == DType::kF16) {
      return F64ToF16(static_cast<double>(i));
    } else if constexpr (T == DType::kBF16) {
      return F64ToBF16(static_cast<double>(i));
    } else {
      return SaturateFromInt<Out>(i);
    }
  }
}

// ---- unary ---------------------------------------------------------------------------------

template <typename T>
T Gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
}

// Float math over a contiguous block; Eigen vectorizes exp/log/sqrt/tanh/logistic.
template <typename T>
void UnaryFloat(UnaryOp op, const T* x, T* y, int64_t n, T alpha, T beta) {
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<const Array> X(x, n);
  Eigen::Map<Array> Y(y, n);
  switch (op) {
    case UnaryOp::kNeg:
      Y = -X;
      return;
    case UnaryOp::kAbs:
      Y = X.abs();
      return;
    case UnaryOp::kRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];  // NaN stays NaN
      return;
    case UnaryOp::kExp: {
      Y = X.exp();
      // Eigen clamps its argument near the underflow threshold (exp(-inf) would come out
      // as the smallest normal); redo those few elements exactly.
      const T kClamp = std::is_same_v<T, float> ? T(-87) : T(-707);
      for (int64_t i = 0; i < n; ++i) {
        if (x[i] < kClamp) y[i] = std::exp(x[i]);
      }
      return;
    }
    case UnaryOp::kLog:
      Y = X.log();
      // Eigen treats subnormal arguments as the smallest normal; redo those exactly.
      for (int64_t i = 0; i < n; ++i) {
        if (x[i] > T(0) && x[i] < std::numeric_limits<T>::min()) y[i] = std::log(x[i]);
      }
      return;
    case UnaryOp::kSqrt:  // correctly rounded (Eigen's fast float sqrt is not, nor sqrt(inf))
      for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
      return;
    case UnaryOp::kRsqrt:  // 1 / sqrt(x), two correct roundings, as the CUDA kernel computes it
      for (int64_t i = 0; i < n; ++i) y[i] = T(1) / std::sqrt(x[i]);
      return;
    case UnaryOp::kGelu:
      for (int64_t i = 0; i < n; ++i) y[i] = Gelu(x[i]);
      return;
    case UnaryOp::kSigmoid:  // 1 / (1 + exp(-x)): Eigen's logistic is off by 1000s of ulps
      Y = (T(1) + (-X).exp()).inverse();
      return;
    case UnaryOp::kTanh:  // the C library's: Eigen's float tanh is 4+ ulps off from |x| ~ 5
      for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
      return;
    case UnaryOp::kScale:
      Y = X * alpha + beta;
      return;
  }
}

template <typename T>
T WrapNeg(T v) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(U{0} - static_cast<U>(v));
}

template <typename T>
void UnaryInt(UnaryOp op, const T* x, T* y, int64_t n) {
  switch (op) {
    case UnaryOp::kNeg:
      for (int64_t i = 0; i < n; ++i) y[i] = WrapNeg(x[i]);
      return;
    case UnaryOp::kAbs:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0 ? WrapNeg(x[i]) : x[i];
      return;
    case UnaryOp::kRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0 ? T(0) : x[i];
      return;
    default:
      return;  // the registry admits only float dtypes for the other ops
  }
}

template <DType D>
void UnaryRange(UnaryOp op, const void* in, void* out, int64_t begin, int64_t end, double alpha,
                double beta) {
  using S = typename Elem<D>::Storage;
  const S* x = static_cast<const S*>(in) + begin;
  S* y = static_cast<S*>(out) + begin;
  int64_t n = end - begin;
  if constexpr (D == DType::kF32 || D == DType::kF64) {
    UnaryFloat<S>(op, x, y, n, static_cast<S>(alpha), static_cast<S>(beta));
  } else if constexpr (D == DType::kF16 || D == DType::kBF16) {
    // Widen a block to f32, compute, round each result once.
    constexpr int64_t kBlock = 1024;
    float buffer[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      int64_t m = std::min(kBlock, n - i);
      for (int64_t j = 0; j < m; ++j) buffer[j] = Elem<D>::Load(x[i + j]);
      UnaryFloat<float>(op, buffer, buffer, m, static_cast<float>(alpha), static_cast<float>(beta));
      for (int64_t j = 0; j < m; ++j) y[i + j] = Elem<D>::Store(buffer[j]);
    }
  } else if constexpr (D == DType::kI32 || D == DType::kI64) {
    UnaryInt<S>(op, x, y, n);
  }
}

// ---- binary --------------------------------------------------------------------------------

template <typename T>
T WrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <typename T>
T WrapSub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}
template <typename T>
T WrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if constexpr (sizeof(T) < sizeof(unsigned)) {
    return static_cast<T>(static_cast<unsigned>(a) * static_cast<unsigned>(b));
  } else {
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  }
}

template <BinaryOp Op, typename C>
C Apply(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if constexpr (Op == BinaryOp::kAdd) return a + b;
    if constexpr (Op == BinaryOp::kSub) return a - b;
    if constexpr (Op == BinaryOp::kMul) return a * b;
    if constexpr (Op == BinaryOp::kDiv) return a / b;
    if constexpr (Op == BinaryOp::kMaximum) return (a != a || a > b) ? a : b;  // NaN wins
    if constexpr (Op == BinaryOp::kMinimum) return (a != a || a < b) ? a : b;
    if constexpr (Op == BinaryOp::kPow) return std::pow(a, b);
  } else {
    if constexpr (Op == BinaryOp::kAdd) return WrapAdd(a, b);
    if constexpr (Op == BinaryOp::kSub) return WrapSub(a, b);
    if constexpr (Op == BinaryOp::kMul) return WrapMul(a, b);
    if constexpr (Op == BinaryOp::kDiv) {
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<C>) {
        if (b == -1) return WrapNeg(a);  // INT_MIN / -1 would trap
      }
      return static_cast<C>(a / b);
    }
    if constexpr (Op == BinaryOp::kMaximum) return a > b ? a : b;
    if constexpr (Op == BinaryOp::kMinimum) return a < b ? a : b;
    if constexpr (Op == BinaryOp::kPow) return 0;  // float-only in the registry
  }
}

// A contiguous run of outputs; each input either advances (stride 1) or repeats (0).
// Outputs never overlap inputs (the backend stages aliased launches), hence __restrict.
template <DType D, BinaryOp Op, int SA, int SB>
void BinaryRun(const typename Elem<D>::Storage* __restrict a,
               const typename Elem<D>::Storage* __restrict b,
               typename Elem<D>::Storage* __restrict y, int64_t n) {
  using E = Elem<D>;
  for (int64_t j = 0; j < n; ++j) {
    y[j] = E::Store(Apply<Op>(E::Load(a[j * SA]), E::Load(b[j * SB])));
  }
}

template <DType D, BinaryOp Op>
void BinaryRange(const BroadcastGeometry& g, const void* in_a, const void* in_b, void* out,
                 int64_t begin, int64_t end) {
  using S = typename Elem<D>::Storage;
  const S* a = static_cast<const S*>(in_a);
  const S* b = static_cast<const S*>(in_b);
  S* y = static_cast<S*>(out);
  const size_t rank = g.shape.size();
  const int64_t inner = g.shape[rank - 1];
  const int64_t sa = g.strides[0][rank - 1];
  const int64_t sb = g.strides[1][rank - 1];
  std::vector<int64_t> index(rank);
  int64_t offset_a = 0;
  int64_t offset_b = 0;
  int64_t rest = begin;
  for (size_t d = rank; d-- > 0;) {
    index[d] = rest % g.shape[d];
    rest /= g.shape[d];
    offset_a += index[d] * g.strides[0][d];
    offset_b += index[d] * g.strides[1][d];
  }
  for (int64_t pos = begin; pos < end;) {
    int64_t n = std::min(inner - index[rank - 1], end - pos);
    const S* pa = a + offset_a;
    const S* pb = b + offset_b;
    if (sa == 1 && sb == 1) {
      BinaryRun<D, Op, 1, 1>(pa, pb, y + pos, n);
    } else if (sa == 1) {
      BinaryRun<D, Op, 1, 0>(pa, pb, y + pos, n);
    } else if (sb == 1) {
      BinaryRun<D, Op, 0, 1>(pa, pb, y + pos, n);
    } else {
      BinaryRun<D, Op, 0, 0>(pa, pb, y + pos, n);
    }
    pos += n;
    offset_a += n * sa;
    offset_b += n * sb;
    index[rank - 1] += n;
    // Carry into outer dimensions.
    for (size_t d = rank - 1; d > 0 && index[d] == g.shape[d]; --d) {
      offset_a -= g.shape[d] * g.strides[0][d];
      offset_b -= g.shape[d] * g.strides[1][d];
      index[d] = 0;
      ++index[d - 1];
      offset_a += g.strides[0][d - 1];
      offset_b += g.strides[1][d - 1];
    }
  }
}

template <DType D>
void BinaryDispatch(BinaryOp op, const BroadcastGeometry& g, const void* a, const void* b, void* y,
                    int64_t begin, int64_t end) {
  switch (op) {
    case BinaryOp::kAdd:
      return BinaryRange<D, BinaryOp::kAdd>(g, a, b, y, begin, end);
    case BinaryOp::kSub:
      return BinaryRange<D, BinaryOp::kSub>(g, a, b, y, begin, end);
    case BinaryOp::kMul:
      return BinaryRange<D, BinaryOp::kMul>(g, a, b, y, begin, end);
    case BinaryOp::kDiv:
      return BinaryRange<D, BinaryOp::kDiv>(g, a, b, y, begin, end);
    case BinaryOp::kMaximum:
      return BinaryRange<D, BinaryOp::kMaximum>(g, a, b, y, begin, end);
    case BinaryOp::kMinimum:
      return BinaryRange<D, BinaryOp::kMinimum>(g, a, b, y, begin, end);
    case BinaryOp::kPow:
      if constexpr (kIsFloat<D>) return BinaryRange<D, BinaryOp::kPow>(g, a, b, y, begin, end);
      return;
  }
}

}  // namespace

void RunFill(const Plan& plan, void* out, Parallel& parallel) {
  const TensorMeta& meta = plan.outputs[0];
  double value = AttrFloat(plan.attrs, "value");
  Dispatch(meta.dtype, [&]<DType D>() {
    using S = typename Elem<D>::Storage;
    S v = Convert<DType::kF64, D>(value);
    S* y = static_cast<S*>(out);
    parallel.For(CheckedNumElements(meta.shape), kElementGrain,
                 [&](int64_t b, int64_t e) { std::fill(y + b, y + e, v); });
  });
}

void RunCopy(const Plan& plan, const void* in, void* out, Parallel& parallel) {
  int64_t bytes = CheckedNumElements(plan.inputs[0].shape) *
                  static_cast<int64_t>(DTypeSize(plan.inputs[0].dtype));
  parallel.For(bytes, kElementGrain * 4, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char*>(out) + b, static_cast<const char*>(in) + b,
                static_cast<size_t>(e - b));
  });
}

void RunCast(const Plan& plan, const void* in, void* out, Parallel& parallel) {
  int64_t n = CheckedNumElements(plan.inputs[0].shape);
  Dispatch(plan.inputs[0].dtype, [&]<DType S>() {
    Dispatch(plan.outputs[0].dtype, [&]<DType T>() {
      const auto* x = static_cast<const typename Elem<S>::Storage*>(in);
      auto* y = static_cast<typename Elem<T>::Storage*>(out);
      parallel.For(n, kElementGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) y[i] = Convert<S, T>(Elem<S>::Load(x[i]));
      });
    });
  });
}

void RunUnary(UnaryOp op, const Plan& plan, const void* in, void* out, Parallel& parallel) {
  double alpha = op == UnaryOp::kScale ? AttrFloat(plan.attrs, "alpha") : 1.0;
  double beta = op == UnaryOp::kScale ? AttrFloat(plan.attrs, "beta") : 0.0;
  int64_t n = CheckedNumElements(plan.inputs[0].shape);
  Dispatch(plan.inputs[0].dtype, [&]<DType D>() {
    parallel.For(n, kElementGrain,
                 [&](int64_t b, int64_t e) { UnaryRange<D>(op, in, out, b, e, alpha, beta); });
  });
}

void RunBinary(BinaryOp op, const Plan& plan, const void* a, const void* b, void* out,
               Parallel& parallel) {
  const Shape& shape = plan.outputs[0].shape;
  int64_t n = CheckedNumElements(shape);
  if (n == 0) return;
  BroadcastGeometry g = MakeBroadcast(shape, {plan.inputs[0].shape, plan.inputs[1].shape});
  Dispatch(plan.outputs[0].dtype, [&]<DType D>() {
    parallel.For(n, kElementGrain, [&](int64_t begin, int64_t end) {
      BinaryDispatch<D>(op, g, a, b, out, begin, end);
    });
  });
}

}  // namespace tessera::kernels::cpu
