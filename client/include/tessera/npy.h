#ifndef TESSERA_NPY_H_
#define TESSERA_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "tessera/v1/compute.pb.h"

namespace tessera {

/// A NumPy array: its dtype, shape and row-major little-endian bytes.
struct NpyArray {
  v1::DType dtype = v1::DTYPE_F32;
  std::vector<int64_t> shape;
  std::string data;
};

/// Parses a .npy file (format 1.0, 2.0 or 3.0; C order; little-endian f2/f4/f8/i4/i8/u1/b1).
/// INVALID_ARGUMENT naming what is unsupported (Fortran order, big-endian, other dtypes).
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes);
/// Serializes to format 1.0 (2.0 when the header needs it). bf16 has no NumPy dtype:
/// INVALID_ARGUMENT (cast to f32 first).
absl::StatusOr<std::string> FormatNpy(const NpyArray& array);

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);
absl::Status WriteNpyFile(const std::string& path, const NpyArray& array);

}  // namespace tessera

#endif  // TESSERA_NPY_H_
