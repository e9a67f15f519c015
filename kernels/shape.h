#ifndef TESSERA_KERNELS_SHAPE_H_
#define TESSERA_KERNELS_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "kernels/dtype.h"

namespace tessera::kernels {

using Shape = std::vector<int64_t>;

inline constexpr size_t kMaxRank = 8;
/// Largest tensor, in bytes and elements (products are checked against it).
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 62;

/// The type and shape of a tensor.
struct TensorMeta {
  DType dtype = DType::kF32;
  Shape shape;

  friend bool operator==(const TensorMeta&, const TensorMeta&) = default;
};

/// Element count; INVALID_ARGUMENT naming `field` for rank > 8, a negative dimension, or a
/// product past kMaxTensorBytes. A scalar (empty shape) has one element.
absl::StatusOr<int64_t> NumElements(const Shape& shape, absl::string_view field = "shape");
/// Bytes of a tensor, with the same checks.
absl::StatusOr<int64_t> ByteSize(const TensorMeta& meta, absl::string_view field = "shape");
/// Element count of a shape already validated (no checks).
int64_t CheckedNumElements(const Shape& shape);

/// NumPy broadcasting of two shapes; INVALID_ARGUMENT naming both when incompatible.
absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);

/// Row-major strides in elements.
std::vector<int64_t> ContiguousStrides(const Shape& shape);

/// "[2, 3, 4]"; "[]" for a scalar.
std::string ShapeString(const Shape& shape);
/// "f32[2, 3]".
std::string MetaString(const TensorMeta& meta);

/// Normalizes an axis in [-rank, rank) to [0, rank); INVALID_ARGUMENT naming `field`.
absl::StatusOr<int> NormalizeAxis(int64_t axis, size_t rank, absl::string_view field);

}  // namespace tessera::kernels

#endif  // TESSERA_KERNELS_SHAPE_H_
