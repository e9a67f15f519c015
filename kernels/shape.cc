#include "kernels/shape.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera::kernels {

absl::StatusOr<int64_t> NumElements(const Shape& shape, absl::string_view field) {
  if (shape.size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", shape.size(), " dimensions; the limit is ", kMaxRank));
  }
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = shape[i];
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] is ", d, "; dimensions must be >= 0"));
    }
    if (d != 0 && n > kMaxTensorBytes / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " ", ShapeString(shape), " has more than 2^62 elements"));
    }
    n *= d;
  }
  return n;
}

absl::StatusOr<int64_t> ByteSize(const TensorMeta& meta, absl::string_view field) {
  absl::StatusOr<int64_t> n = NumElements(meta.shape, field);
  if (!n.ok()) return n.status();
  int64_t size = static_cast<int64_t>(DTypeSize(meta.dtype));
  if (*n > kMaxTensorBytes / size) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", MetaString(meta), " is more than 2^62 bytes"));
  }
  return *n * size;
}

int64_t CheckedNumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (da != db && da != 1 && db != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shapes ", ShapeString(a), " and ", ShapeString(b), " do not broadcast"));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> ContiguousStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string MetaString(const TensorMeta& meta) {
  return absl::StrCat(DTypeName(meta.dtype), ShapeString(meta.shape));
}

absl::StatusOr<int> NormalizeAxis(int64_t axis, size_t rank, absl::string_view field) {
  int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", axis, "; the range is ", -r, "..", r - 1, " for rank ", rank));
  }
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

}  // namespace tessera::kernels
