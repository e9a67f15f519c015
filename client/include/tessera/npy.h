#ifndef TESSERA_NPY_H_
#define TESSERA_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
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
/// The header FormatNpy writes before the data (magic, version, dictionary, padding to 64
/// bytes), for writers that send the data from where it already is.
absl::StatusOr<std::string> FormatNpyHeader(v1::DType dtype, const std::vector<int64_t>& shape);

/// What a .npy header says: the array's dtype and shape and how many data bytes follow.
struct NpyHeader {
  v1::DType dtype = v1::DTYPE_F32;
  std::vector<int64_t> shape;
  uint64_t data_bytes = 0;
  /// For messages: the dtype and shape as the file writes them ("<f4", "(2, 3)").
  std::string descr;
  std::string shape_text;
};
/// Reads the header of a .npy stream from `fd`, leaving `fd` at the first data byte, so the
/// data can be streamed on from there. Errors as ParseNpy's; UNAVAILABLE for a read error.
absl::StatusOr<NpyHeader> ReadNpyHeader(int fd, absl::string_view name);

/// Reads one .npy stream from `fd` (a file or a pipe; it is not closed) to its end: the header,
/// then the data straight into NpyArray::data (one copy, no intermediate buffer). Errors as
/// ParseNpy's, also when the stream ends early or goes on past the data; UNAVAILABLE for a
/// read error. (`tessera tensor put` streams instead: ReadNpyHeader, then chunk by chunk.)
absl::StatusOr<NpyArray> ReadNpy(int fd, absl::string_view name);
/// Writes `array` as .npy to `fd`: the header, then NpyArray::data as it is (no
/// concatenated copy). UNAVAILABLE naming `name` for a write error (a closed pipe is EPIPE
/// where SIGPIPE is ignored). Does not close `fd`.
absl::Status WriteNpy(int fd, const NpyArray& array, absl::string_view name);

/// ReadNpy of the file at `path`; NOT_FOUND when it cannot be opened.
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);
/// WriteNpy to `path`, created (mode 0666 less the umask) or truncated.
absl::Status WriteNpyFile(const std::string& path, const NpyArray& array);

}  // namespace tessera

#endif  // TESSERA_NPY_H_
