#ifndef TESSERA_KERNELS_GEOMETRY_H_
#define TESSERA_KERNELS_GEOMETRY_H_

// How a prepared plan walks its buffers, computed once on the host and shared by every
// backend (the CPU loops and the CUDA launch parameters read the same geometry).
#include <cstdint>
#include <vector>

#include "kernels/registry.h"
#include "kernels/shape.h"

namespace tessera::kernels {

/// An output shape with size-1 dimensions dropped and contiguous neighbours merged, and each
/// input's element strides over it (0 where the input broadcasts). Never empty.
struct BroadcastGeometry {
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> strides;  // one per input
};
BroadcastGeometry MakeBroadcast(const Shape& out, const std::vector<Shape>& ins);

/// Input dimensions split into kept and reduced ones (size-1 dimensions dropped, runs of
/// the same kind merged), with element strides into the contiguous input.
struct ReduceGeometry {
  std::vector<int64_t> kept_shape, kept_strides;
  std::vector<int64_t> reduced_shape, reduced_strides;
  int64_t kept_count = 1;
  int64_t reduced_count = 1;
};
ReduceGeometry MakeReduceGeometry(const Shape& shape, const std::vector<bool>& reduced);
/// Which input dimensions a reduction plan ("axes" attribute; empty: all) reduces.
std::vector<bool> ReducedDims(const Plan& plan);

/// (outer, axis length, inner) of a contiguous shape around `axis`.
struct AxisGeometry {
  int64_t outer = 1, length = 1, inner = 1;
};
AxisGeometry AroundAxis(const Shape& shape, int axis);
/// The plan's "axis" attribute made non-negative (0 for a scalar input).
int AxisOf(const Plan& plan);

/// Row-major y[batch] = alpha * op(a) @ op(b) + beta * y with broadcast batches.
struct MatmulGeometry {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  int64_t lda = 0, ldb = 0;
  Shape batch;                              // broadcast batch shape
  std::vector<int64_t> a_offset, b_offset;  // per batch, in elements
};
MatmulGeometry MakeMatmulGeometry(const Plan& plan);

}  // namespace tessera::kernels

#endif  // TESSERA_KERNELS_GEOMETRY_H_
