#include "kernels/reduced_axes.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera::kernels {

absl::StatusOr<std::vector<int>> ReducedAxes(const std::vector<int64_t>& given, size_t rank) {
  std::vector<int> axes;
  if (given.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (size_t i = 0; i < given.size(); ++i) {
    absl::StatusOr<int> a = NormalizeAxis(given[i], rank, absl::StrCat("axes[", i, "]"));
    if (!a.ok()) return a.status();
    if (std::find(axes.begin(), axes.end(), *a) != axes.end()) {
      return absl::InvalidArgumentError(absl::StrCat("axes lists axis ", *a, " twice"));
    }
    axes.push_back(*a);
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

Shape ReducedShape(const Shape& shape, const std::vector<int>& axes, bool keepdims) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), static_cast<int>(d)) != axes.end();
    if (!reduced) {
      out.push_back(shape[d]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  return out;
}

}  // namespace tessera::kernels
