#ifndef TESSERA_SERVER_COMMON_BYTE_SIZE_H_
#define TESSERA_SERVER_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

/// Parses "1048576", "512MiB", "1.5GiB", "2G" (binary units: K/Ki/KiB = 1024, up to P).
/// INVALID_ARGUMENT for anything else or a value past 2^63.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

/// A byte count usable as an absl flag ("--cpu_memory_bytes=8GiB").
struct ByteSize {
  uint64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error);
std::string AbslUnparseFlag(ByteSize value);

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMON_BYTE_SIZE_H_
