#ifndef TESSERA_KERNELS_REDUCED_AXES_H_
#define TESSERA_KERNELS_REDUCED_AXES_H_

// The axes a reduction runs over, for the catalog's reductions (catalog.cc) and tenant-defined
// ones (expr/user_kernel.cc), which read and check them the same way.
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

#include "kernels/shape.h"

namespace tessera::kernels {

/// The reduced axes of a `rank`-d shape, normalized and sorted; an empty `given` means every
/// axis. INVALID_ARGUMENT for an axis out of [-rank, rank) (naming "axes[i]") or one listed
/// twice.
absl::StatusOr<std::vector<int>> ReducedAxes(const std::vector<int64_t>& given, size_t rank);

/// `shape` without the reduced `axes`, or with them of size 1 when `keepdims`.
Shape ReducedShape(const Shape& shape, const std::vector<int>& axes, bool keepdims);

}  // namespace tessera::kernels

#endif  // TESSERA_KERNELS_REDUCED_AXES_H_
