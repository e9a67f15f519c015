#ifndef TESSERA_COMMON_BYTE_SIZE_H_
#define TESSERA_COMMON_BYTE_SIZE_H_

// Sizes as people write them, read the way Kubernetes reads quantities: one parser for the
// server's flags and the CLI (client/cli/parse.h re-exports it).
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

/// How a size was written.
enum class SizeUnits {
  kBytes,    // a plain number of bytes: "1073741824"
  kBinary,   // Ki, Mi, Gi, Ti, Pi, Ei (optionally ...B): powers of 1024
  kDecimal,  // k/K, M, G, T, P, E (optionally ...B): powers of 1000, as Kubernetes reads them
};

struct ParsedSize {
  uint64_t bytes = 0;
  SizeUnits units = SizeUnits::kBytes;
};

/// The syntax ParseSize accepts, in words, for help texts and error messages.
inline constexpr char kSizeSyntax[] =
    "a number of bytes with an optional unit: Ki, Mi, Gi, Ti (powers of 1024) or K, M, G, T "
    "(powers of 1000), e.g. 2Gi or 500M";

/// Parses a size as Kubernetes does: "1073741824", "2Gi", "1.5G", "512MiB", "1GB", "64k",
/// "1 Ti". Units are case-insensitive except "m", which Kubernetes reads as milli and is
/// refused. A fraction must come to a whole number of bytes ("0.5Ki" is 512; "0.3Ki" is
/// refused). At most 2^63-1 bytes. INVALID_ARGUMENT showing kSizeSyntax otherwise.
absl::StatusOr<ParsedSize> ParseSize(absl::string_view text);

/// ParseSize's number of bytes.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

/// A byte count usable as an absl flag ("--cpu_memory_bytes=8Gi").
struct ByteSize {
  uint64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error);
std::string AbslUnparseFlag(ByteSize value);

}  // namespace tessera

#endif  // TESSERA_COMMON_BYTE_SIZE_H_
