#ifndef TESSERA_KERNELS_CUDA_PARAMS_H_
#define TESSERA_KERNELS_CUDA_PARAMS_H_

// Launch-parameter structs shared by the CUDA kernels (device side) and the backend that
// fills them (host side). Plain C++ so the host compiler and nvcc agree on the layout; each
// is passed by value as one kernel argument.
#include <cstdint>

namespace tessera_cuda {

inline constexpr int kMaxRank = 8;

/// Operation codes; the numbering is the kernels' ABI with the host.
enum UnaryCode : int {
  kNeg = 0,
  kAbs,
  kRelu,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kGelu,
  kSigmoid,
  kTanh,
  kScale
};
enum BinaryCode : int { kAdd = 0, kSub, kMul, kDiv, kMaximum, kMinimum, kPow };
enum ReduceCode : int { kSum = 0, kMean, kMax, kMin };

/// Element-wise with broadcasting: the output walked linearly, each input with its strides
/// over the (merged) output shape. `contiguous`: both inputs walk the output one-to-one.
struct BinaryParams {
  int64_t n;
  int rank;
  int contiguous;
  int64_t shape[kMaxRank];
  int64_t stride_a[kMaxRank];
  int64_t stride_b[kMaxRank];
};

/// A reduction: outputs over the kept dimensions, each reducing the reduced dimensions.
struct ReduceParams {
  int64_t outputs;
  int64_t count;  // reduced elements per output (0 for an empty input)
  int kept_rank;
  int reduced_rank;
  int64_t kept_shape[kMaxRank];
  int64_t kept_strides[kMaxRank];
  int64_t reduced_shape[kMaxRank];
  int64_t reduced_strides[kMaxRank];
};

/// Along one axis of a contiguous tensor: rows are (outer, inner) pairs of `length` elements.
struct AxisParams {
  int64_t outer;
  int64_t length;
  int64_t inner;
};

/// y[i] = x[Offset(i over out_shape, in_strides)] (transpose: strides permuted).
struct PermuteParams {
  int64_t n;
  int rank;
  int64_t out_shape[kMaxRank];
  int64_t in_strides[kMaxRank];
};

}  // namespace tessera_cuda

#endif  // TESSERA_KERNELS_CUDA_PARAMS_H_
