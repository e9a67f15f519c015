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

/// A .npy array read from a file descriptor for sending, its data left where it can stay: a
/// regular file is mapped read-only (no copy at all); a pipe or terminal (stdin) is read once
/// into a buffer of exactly the data's size, with its pages populated up front rather than
/// faulted in one by one. Move-only; data() stays valid while this object lives.
class NpyInput {
 public:
  /// Reads `fd` to its end (it is not closed). `name` labels the errors ("stdin" for 0).
  /// Errors as ParseNpy's, also when the stream ends early or goes on past the data;
  /// UNAVAILABLE for a read error. Blocks.
  static absl::StatusOr<NpyInput> Read(int fd, absl::string_view name);

  NpyInput(NpyInput&& other) noexcept;
  NpyInput& operator=(NpyInput&& other) noexcept;
  NpyInput(const NpyInput&) = delete;
  NpyInput& operator=(const NpyInput&) = delete;
  ~NpyInput();

  v1::DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  /// The array's bytes, row-major little-endian.
  absl::string_view data() const { return data_; }

 private:
  NpyInput() = default;

  v1::DType dtype_ = v1::DTYPE_F32;
  std::vector<int64_t> shape_;
  absl::string_view data_;
  void* mapping_ = nullptr;  // what munmap releases: the file or the buffer
  size_t mapping_size_ = 0;
};
/// Writes `array` as .npy to `fd`: the header, then NpyArray::data as it is (no
/// concatenated copy). UNAVAILABLE naming `name` for a write error (a closed pipe is EPIPE
/// where SIGPIPE is ignored). Does not close `fd`.
absl::Status WriteNpy(int fd, const NpyArray& array, absl::string_view name);

/// NpyInput::Read of the file at `path`, copied into an NpyArray; NOT_FOUND when it cannot
/// be opened.
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);
/// WriteNpy to `path`, created (mode 0666 less the umask) or truncated.
absl::Status WriteNpyFile(const std::string& path, const NpyArray& array);

}  // namespace tessera

#endif  // TESSERA_NPY_H_
