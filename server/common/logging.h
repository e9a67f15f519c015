#ifndef TESSERA_SERVER_COMMON_LOGGING_H_
#define TESSERA_SERVER_COMMON_LOGGING_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fmt/format.h"

namespace tessera {

/// Sends spdlog's default logger to stderr as `format` "text" or "json" (one JSON object
/// per line: time (UTC), level, thread, msg) at `level` (trace..critical, off).
/// INVALID_ARGUMENT for unknown values. Call once at start, before other threads log.
absl::Status InitLogging(absl::string_view format, absl::string_view level);

}  // namespace tessera

/// Lets spdlog/fmt print absl::string_view (a distinct type in Debian's Abseil build).
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

#endif  // TESSERA_SERVER_COMMON_LOGGING_H_
