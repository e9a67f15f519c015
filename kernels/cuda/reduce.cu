// Reductions over axes, argmax, softmax / log_softmax and the two norms. One block per
// output row; values are accumulated in f32 (f64 for f64 inputs, i64 for integer sums).
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace tessera_cuda {
namespace {

// The type values are shuffled in: narrow integers widen to int.
template <typename C>
using Shuffled = std::conditional_t<(sizeof(C) < 4), int, C>;

template <typename S, int Op>
struct Reducer {
  using C = typename Elem<S>::C;
  static constexpr bool kFloat = std::is_floating_point_v<C>;
  static constexpr bool kSumLike = Op == kSum || Op == kMean;
  using Acc =
      std::conditional_t<kSumLike, std::conditional_t<kFloat, double, int64_t>, Shuffled<C>>;

  static __device__ Acc Init() {
    if constexpr (kSumLike) {
      return Acc(0);
    } else if constexpr (kFloat) {
      return Op == kMax ? -INFINITY : INFINITY;
    } else if constexpr (std::is_same_v<C, uint8_t>) {
      return Op == kMax ? 0 : 255;
    } else if constexpr (std::is_same_v<C, int32_t>) {
      return Op == kMax ? INT32_MIN : INT32_MAX;
    } else {
      return Op == kMax ? INT64_MIN : INT64_MAX;
    }
  }
  static __device__ Acc Combine(Acc a, Acc b) {
    if constexpr (kSumLike) {
      if constexpr (kFloat) {
        return a + b;
      } else {
        return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      }
    } else if constexpr (Op == kMax) {
      if (IsNan(a)) return a;  // NaN, once seen, stays
      return (IsNan(b) || b > a) ? b : a;
    } else {
      if (IsNan(a)) return a;
      return (IsNan(b) || b < a) ? b : a;
    }
  }
};

template <typename S, int Op>
__device__ void Reduce(const ReduceParams& p, const S* __restrict__ x, void* y) {
  using R = Reducer<S, Op>;
  using Acc = typename R::Acc;
  using Out = std::conditional_t<R::kSumLike && !R::kFloat, int64_t, S>;
  auto combine = [](Acc a, Acc b) { return R::Combine(a, b); };
  for (int64_t o = blockIdx.x; o < p.outputs; o += gridDim.x) {
    const int64_t base = Offset(o, p.kept_rank, p.kept_shape, p.kept_strides);
    Acc acc = R::Init();
    for (int64_t r = threadIdx.x; r < p.count; r += blockDim.x) {
      const Acc v = static_cast<Acc>(
          Elem<S>::Load(x[base + Offset(r, p.reduced_rank, p.reduced_shape, p.reduced_strides)]));
      acc = R::Combine(acc, v);
    }
    acc = BlockReduce(acc, combine);
    if (threadIdx.x == 0) {
      Out* out = static_cast<Out*>(y);
      if constexpr (Op == kMean) {
        const double mean = p.count == 0 ? NAN : acc / static_cast<double>(p.count);
        out[o] = Elem<S>::Store(static_cast<typename Elem<S>::C>(mean));
      } else if constexpr (R::kSumLike && !R::kFloat) {
        out[o] = acc;
      } else {
        out[o] = Elem<S>::Store(static_cast<typename Elem<S>::C>(acc));
      }
    }
  }
}

template <typename S>
__device__ void ReduceDispatch(int op, const ReduceParams& p, const S* x, void* y) {
  switch (op) {
    case kSum:
      return Reduce<S, kSum>(p, x, y);
    case kMean:
      if constexpr (std::is_floating_point_v<typename Elem<S>::C>) Reduce<S, kMean>(p, x, y);
      return;
    case kMax:
      return Reduce<S, kMax>(p, x, y);
    case kMin:
      return Reduce<S, kMin>(p, x, y);
  }
}

// The better of two (value, index) candidates: the first NaN, else the larger value, ties
// to the smaller index (the CPU backend's "first maximum, NaN counts as the maximum").
template <typename V>
__device__ __forceinline__ bool Better(V a, int64_t ia, V b, int64_t ib) {
  if (ib < 0) return true;
  if (ia < 0) return false;
  const bool na = IsNan(a), nb = IsNan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

template <typename S>
__device__ void Argmax(const AxisParams& p, const S* __restrict__ x, int64_t* __restrict__ y) {
  using V = Shuffled<typename Elem<S>::C>;
  __shared__ unsigned char raw[32 * (sizeof(V) + sizeof(int64_t))];
  V* values = reinterpret_cast<V*>(raw);
  int64_t* indexes = reinterpret_cast<int64_t*>(raw + 32 * sizeof(V));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int64_t row = blockIdx.x; row < p.outer * p.inner; row += gridDim.x) {
    const S* base = x + (row / p.inner) * p.length * p.inner + row % p.inner;
    V best = V(0);
    int64_t best_index = -1;
    for (int64_t k = threadIdx.x; k < p.length; k += blockDim.x) {
      const V v = static_cast<V>(Elem<S>::Load(base[k * p.inner]));
      if (Better(v, k, best, best_index)) {
        best = v;
        best_index = k;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const V v = __shfl_down_sync(0xffffffffu, best, offset);
      const int64_t k = __shfl_down_sync(0xffffffffu, best_index, offset);
      if (Better(v, k, best, best_index)) {
        best = v;
        best_index = k;
      }
    }
    __syncthreads();
    if (lane == 0) {
      values[warp] = best;
      indexes[warp] = best_index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < warps; ++w) {
        if (Better(values[w], indexes[w], best, best_index)) {
          best = values[w];
          best_index = indexes[w];
        }
      }
      y[row] = best_index < 0 ? 0 : best_index;
    }
  }
}

template <typename S>
__device__ void Softmax(int log_out, const AxisParams& p, const S* __restrict__ x,
                        S* __restrict__ y) {
  using C = typename Elem<S>::C;
  auto max_of = [](C a, C b) { return (IsNan(a) || a > b) ? a : b; };  // NaN propagates
  auto sum_of = [](C a, C b) { return a + b; };
  for (int64_t row = blockIdx.x; row < p.outer * p.inner; row += gridDim.x) {
    const int64_t base = (row / p.inner) * p.length * p.inner + row % p.inner;
    C max = -INFINITY;
    for (int64_t k = threadIdx.x; k < p.length; k += blockDim.x) {
      max = max_of(max, Elem<S>::Load(x[base + k * p.inner]));
    }
    max = BlockAllReduce(max, max_of);
    C sum = 0;
    for (int64_t k = threadIdx.x; k < p.length; k += blockDim.x) {
      sum += exp(Elem<S>::Load(x[base + k * p.inner]) - max);
    }
    sum = BlockAllReduce(sum, sum_of);
    const C log_sum = log(sum);
    for (int64_t k = threadIdx.x; k < p.length; k += blockDim.x) {
      const C shifted = Elem<S>::Load(x[base + k * p.inner]) - max;
      y[base + k * p.inner] = Elem<S>::Store(log_out ? shifted - log_sum : exp(shifted) / sum);
    }
  }
}

template <typename S>
__device__ void Norm(int rms, int64_t rows, int64_t width, const S* __restrict__ x,
                     const S* __restrict__ weight, const S* __restrict__ bias, S* __restrict__ y,
                     double eps) {
  using C = typename Elem<S>::C;
  auto sum_of = [](C a, C b) { return a + b; };
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* row = x + r * width;
    C mean = 0;
    if (!rms) {
      C sum = 0;
      for (int64_t k = threadIdx.x; k < width; k += blockDim.x) sum += Elem<S>::Load(row[k]);
      mean = BlockAllReduce(sum, sum_of) / static_cast<C>(width);
    }
    C square = 0;
    for (int64_t k = threadIdx.x; k < width; k += blockDim.x) {
      const C centered = Elem<S>::Load(row[k]) - mean;
      square += centered * centered;
    }
    square = BlockAllReduce(square, sum_of);
    const C inv = C(1) / sqrt(square / static_cast<C>(width) + static_cast<C>(eps));
    for (int64_t k = threadIdx.x; k < width; k += blockDim.x) {
      C v = (Elem<S>::Load(row[k]) - mean) * inv;
      if (weight != nullptr) v *= Elem<S>::Load(weight[k]);
      if (bias != nullptr) v += Elem<S>::Load(bias[k]);
      y[r * width + k] = Elem<S>::Store(v);
    }
  }
}

}  // namespace
}  // namespace tessera_cuda

using namespace tessera_cuda;  // NOLINT: the extern "C" entry points below

#define TESSERA_REDUCE(suffix, S)                                                            \
  extern "C" __global__ void tessera_reduce_##suffix(int op, ReduceParams p, const S* x,     \
                                                     void* y) {                              \
    ReduceDispatch<S>(op, p, x, y);                                                          \
  }                                                                                          \
  extern "C" __global__ void tessera_argmax_##suffix(AxisParams p, const S* x, int64_t* y) { \
    Argmax<S>(p, x, y);                                                                      \
  }
TESSERA_REDUCE(f32, float)
TESSERA_REDUCE(f16, __half)
TESSERA_REDUCE(bf16, __nv_bfloat16)
TESSERA_REDUCE(f64, double)
TESSERA_REDUCE(i32, int32_t)
TESSERA_REDUCE(i64, int64_t)
TESSERA_REDUCE(u8, uint8_t)

#define TESSERA_ROWS(suffix, S)                                                                \
  extern "C" __global__ void tessera_softmax_##suffix(int log_out, AxisParams p, const S* x,   \
                                                      S* y) {                                  \
    Softmax<S>(log_out, p, x, y);                                                              \
  }                                                                                            \
  extern "C" __global__ void tessera_norm_##suffix(int rms, int64_t rows, int64_t width,       \
                                                   const S* x, const S* weight, const S* bias, \
                                                   S* y, double eps) {                         \
    Norm<S>(rms, rows, width, x, weight, bias, y, eps);                                        \
  }
TESSERA_ROWS(f32, float)
TESSERA_ROWS(f16, __half)
TESSERA_ROWS(bf16, __nv_bfloat16)
TESSERA_ROWS(f64, double)
