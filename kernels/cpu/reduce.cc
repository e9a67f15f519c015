// Reductions (sum, mean, max, min, argmax), softmax/log_softmax, layer_norm and rms_norm.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/element.h"
#include "kernels/cpu/kernels_internal.h"

namespace tessera::kernels::cpu {
namespace {

template <DType D, ReduceOp Op>
struct Reducer {
  using C = typename Elem<D>::Compute;
  static constexpr bool kSumLike = Op == ReduceOp::kSum || Op == ReduceOp::kMean;
  using Acc = std::conditional_t<kSumLike, std::conditional_t<kIsFloat<D>, double, int64_t>, C>;

  static Acc Init() {
    if constexpr (kSumLike) {
      return Acc(0);
    } else if constexpr (kIsFloat<D>) {
      return Op == ReduceOp::kMax ? -std::numeric_limits<C>::infinity()
                                  : std::numeric_limits<C>::infinity();
    } else {
      return Op == ReduceOp::kMax ? std::numeric_limits<C>::lowest()
                                  : std::numeric_limits<C>::max();
    }
  }
  static void Add(Acc& acc, C x) {
    if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kMean) {
      if constexpr (kIsFloat<D>) {
        acc += static_cast<double>(x);
      } else {
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(x));
      }
    } else if constexpr (Op == ReduceOp::kMax) {
      if (acc == acc && (x != x || x > acc)) acc = x;  // NaN, once seen, stays
    } else {
      if (acc == acc && (x != x || x < acc)) acc = x;
    }
  }
};

// Combines per-chunk partials in chunk order (sums add accumulators exactly).
template <DType D, ReduceOp Op>
typename Reducer<D, Op>::Acc CombinePartials(const std::vector<typename Reducer<D, Op>::Acc>& p) {
  using R = Reducer<D, Op>;
  typename R::Acc acc = R::Init();
  for (const auto& v : p) {
    if constexpr (R::kSumLike) {
      if constexpr (kIsFloat<D>) {
        acc += v;
      } else {
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v));
      }
    } else {
      R::Add(acc, v);
    }
  }
  return acc;
}

template <DType D, ReduceOp Op>
void ReduceContiguous(const typename Elem<D>::Storage* x, int64_t n, int64_t stride,
                      typename Reducer<D, Op>::Acc& acc) {
  using R = Reducer<D, Op>;
  if constexpr (R::kSumLike && kIsFloat<D>) {
    if (stride == 1) {  // four independent chains keep the adder busy
      double s[4] = {0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        s[0] += Elem<D>::Load(x[i]);
        s[1] += Elem<D>::Load(x[i + 1]);
        s[2] += Elem<D>::Load(x[i + 2]);
        s[3] += Elem<D>::Load(x[i + 3]);
      }
      for (; i < n; ++i) s[0] += Elem<D>::Load(x[i]);
      acc += (s[0] + s[1]) + (s[2] + s[3]);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) R::Add(acc, Elem<D>::Load(x[i * stride]));
}

// Reduces the reduced dimensions starting at `base` into acc (odometer over all but the
// innermost reduced dimension).
template <DType D, ReduceOp Op>
void ReduceOne(const ReduceGeometry& g, const typename Elem<D>::Storage* x, int64_t base,
               typename Reducer<D, Op>::Acc& acc) {
  const size_t r = g.reduced_shape.size();
  if (r == 0) {
    Reducer<D, Op>::Add(acc, Elem<D>::Load(x[base]));
    return;
  }
  const int64_t inner = g.reduced_shape[r - 1];
  const int64_t inner_stride = g.reduced_strides[r - 1];
  std::vector<int64_t> index(r, 0);
  int64_t offset = base;
  for (;;) {
    ReduceContiguous<D, Op>(x + offset, inner, inner_stride, acc);
    size_t d = r - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      ++index[d];
      offset += g.reduced_strides[d];
      if (index[d] < g.reduced_shape[d]) break;
      offset -= index[d] * g.reduced_strides[d];
      index[d] = 0;
    }
  }
}

template <DType D, ReduceOp Op>
void Reduce(const Plan& plan, const void* in, void* out, Parallel& parallel) {
  using R = Reducer<D, Op>;
  using OutS = std::conditional_t<R::kSumLike && !kIsFloat<D>, int64_t, typename Elem<D>::Storage>;
  const Shape& shape = plan.inputs[0].shape;
  ReduceGeometry g = MakeReduceGeometry(shape, ReducedDims(plan));
  const auto* x = static_cast<const typename Elem<D>::Storage*>(in);
  auto* y = static_cast<OutS*>(out);
  const int64_t total = CheckedNumElements(shape);
  // The reduced element count per output (0 when the input is empty).
  const int64_t count = total == 0 ? 0 : g.reduced_count;
  auto finish = [&](typename R::Acc acc) -> OutS {
    if constexpr (Op == ReduceOp::kMean) {
      return Elem<D>::Store(static_cast<typename Elem<D>::Compute>(
          count == 0 ? std::numeric_limits<double>::quiet_NaN()
                     : acc / static_cast<double>(count)));
    } else if constexpr (R::kSumLike && !kIsFloat<D>) {
      return acc;
    } else {
      return Elem<D>::Store(static_cast<typename Elem<D>::Compute>(acc));
    }
  };
  const int64_t outputs = CheckedNumElements(plan.outputs[0].shape);
  if (total == 0) {  // empty input: identity per output (sum 0, mean NaN)
    for (int64_t o = 0; o < outputs; ++o) y[o] = finish(R::Init());
    return;
  }
  if (g.kept_shape.empty()) {
    // One output from a contiguous range: fixed-size chunks, combined in order, so the
    // result does not depend on which worker ran which chunk.
    constexpr int64_t kGrain = 1 << 16;
    std::vector<typename R::Acc> partials((total + kGrain - 1) / kGrain, R::Init());
    parallel.For(total, kGrain, [&](int64_t b, int64_t e) {
      typename R::Acc acc = R::Init();
      ReduceContiguous<D, Op>(x + b, e - b, 1, acc);
      partials[b / kGrain] = acc;
    });
    y[0] = finish(CombinePartials<D, Op>(partials));
    return;
  }
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, count));
  parallel.For(g.kept_count, grain, [&](int64_t b, int64_t e) {
    std::vector<int64_t> index(g.kept_shape.size());
    int64_t rest = b;
    int64_t base = 0;
    for (size_t d = g.kept_shape.size(); d-- > 0;) {
      index[d] = rest % g.kept_shape[d];
      rest /= g.kept_shape[d];
      base += index[d] * g.kept_strides[d];
    }
    for (int64_t o = b; o < e; ++o) {
      typename R::Acc acc = R::Init();
      ReduceOne<D, Op>(g, x, base, acc);
      y[o] = finish(acc);
      for (size_t d = g.kept_shape.size(); d-- > 0;) {  // next kept index
        ++index[d];
        base += g.kept_strides[d];
        if (index[d] < g.kept_shape[d]) break;
        base -= index[d] * g.kept_strides[d];
        index[d] = 0;
      }
    }
  });
}

}  // namespace

void RunReduce(ReduceOp op, const Plan& plan, const void* in, void* out, Parallel& parallel) {
  Dispatch(plan.inputs[0].dtype, [&]<DType D>() {
    if constexpr (D != DType::kBool) {
      switch (op) {
        case ReduceOp::kSum:
          return Reduce<D, ReduceOp::kSum>(plan, in, out, parallel);
        case ReduceOp::kMean:
          if constexpr (kIsFloat<D>) return Reduce<D, ReduceOp::kMean>(plan, in, out, parallel);
          return;
        case ReduceOp::kMax:
          return Reduce<D, ReduceOp::kMax>(plan, in, out, parallel);
        case ReduceOp::kMin:
          return Reduce<D, ReduceOp::kMin>(plan, in, out, parallel);
      }
    }
  });
}

void RunArgmax(const Plan& plan, const void* in, void* out, Parallel& parallel) {
  auto* y = static_cast<int64_t*>(out);
  if (plan.inputs[0].shape.empty()) {
    y[0] = 0;
    return;
  }
  AxisGeometry g = AroundAxis(plan.inputs[0].shape, AxisOf(plan));
  Dispatch(plan.inputs[0].dtype, [&]<DType D>() {
    const auto* x = static_cast<const typename Elem<D>::Storage*>(in);
    parallel.For(g.outer * g.inner, std::max<int64_t>(1, (1 << 14) / g.length),
                 [&](int64_t b, int64_t e) {
                   for (int64_t p = b; p < e; ++p) {
                     const int64_t o = p / g.inner, i = p % g.inner;
                     const auto* row = x + o * g.length * g.inner + i;
                     auto best = Elem<D>::Load(row[0]);
                     int64_t best_index = 0;
                     for (int64_t k = 1; k < g.length && best == best; ++k) {
                       auto v = Elem<D>::Load(row[k * g.inner]);
                       if (v != v || v > best) {  // the first NaN is the maximum
                         best = v;
                         best_index = k;
                       }
                     }
                     y[p] = best_index;
                   }
                 });
  });
}

void RunSoftmax(bool log, const Plan& plan, const void* in, void* out, Parallel& parallel) {
  const Shape& shape = plan.inputs[0].shape;
  AxisGeometry g = shape.empty() ? AxisGeometry{} : AroundAxis(shape, AxisOf(plan));
  if (g.outer * g.length * g.inner == 0) return;
  Dispatch(plan.inputs[0].dtype, [&]<DType D>() {
    if constexpr (kIsFloat<D>) {
      using C = typename Elem<D>::Compute;
      const auto* x = static_cast<const typename Elem<D>::Storage*>(in);
      auto* y = static_cast<typename Elem<D>::Storage*>(out);
      parallel.For(
          g.outer * g.inner, std::max<int64_t>(1, (1 << 13) / g.length), [&](int64_t b, int64_t e) {
            for (int64_t p = b; p < e; ++p) {
              const int64_t base = (p / g.inner) * g.length * g.inner + p % g.inner;
              C max = -std::numeric_limits<C>::infinity();
              for (int64_t k = 0; k < g.length; ++k) {
                C v = Elem<D>::Load(x[base + k * g.inner]);
                if (v != v || v > max) max = v;
              }
              double sum = 0;
              for (int64_t k = 0; k < g.length; ++k) {
                sum += std::exp(static_cast<double>(Elem<D>::Load(x[base + k * g.inner]) - max));
              }
              const double log_sum = std::log(sum);
              for (int64_t k = 0; k < g.length; ++k) {
                double shifted = static_cast<double>(Elem<D>::Load(x[base + k * g.inner]) - max);
                double v = log ? shifted - log_sum : std::exp(shifted) / sum;
                y[base + k * g.inner] = Elem<D>::Store(static_cast<C>(v));
              }
            }
          });
    }
  });
}

void RunNorm(bool rms, const Plan& plan, const std::vector<const void*>& in, void* out,
             Parallel& parallel) {
  const Shape& shape = plan.inputs[0].shape;
  const int64_t width = shape.empty() ? 1 : shape.back();
  const int64_t rows = width == 0 ? 0 : CheckedNumElements(shape) / width;
  const double eps = AttrFloat(plan.attrs, "eps");
  Dispatch(plan.inputs[0].dtype, [&]<DType D>() {
    if constexpr (kIsFloat<D>) {
      using S = typename Elem<D>::Storage;
      using C = typename Elem<D>::Compute;
      const S* x = static_cast<const S*>(in[0]);
      const S* weight = in.size() > 1 ? static_cast<const S*>(in[1]) : nullptr;
      const S* bias = in.size() > 2 ? static_cast<const S*>(in[2]) : nullptr;
      S* y = static_cast<S*>(out);
      parallel.For(rows, std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(1, width)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = b; r < e; ++r) {
                       const S* row = x + r * width;
                       double mean = 0;
                       if (!rms) {
                         for (int64_t k = 0; k < width; ++k) mean += Elem<D>::Load(row[k]);
                         mean /= static_cast<double>(width);
                       }
                       double square = 0;
                       for (int64_t k = 0; k < width; ++k) {
                         double centered = static_cast<double>(Elem<D>::Load(row[k])) - mean;
                         square += centered * centered;
                       }
                       const double inv =
                           1.0 / std::sqrt(square / static_cast<double>(width) + eps);
                       for (int64_t k = 0; k < width; ++k) {
                         double v = (static_cast<double>(Elem<D>::Load(row[k])) - mean) * inv;
                         if (weight != nullptr) v *= static_cast<double>(Elem<D>::Load(weight[k]));
                         if (bias != nullptr) v += static_cast<double>(Elem<D>::Load(bias[k]));
                         y[r * width + k] = Elem<D>::Store(static_cast<C>(v));
                       }
                     }
                   });
    }
  });
}

}  // namespace tessera::kernels::cpu
