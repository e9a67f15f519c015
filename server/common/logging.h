#ifndef TESSERA_SERVER_COMMON_LOGGING_H_
#define TESSERA_SERVER_COMMON_LOGGING_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "fmt/format.h"
#include "spdlog/common.h"

namespace tessera {

/// Sets spdlog's default logger to `format` "text" (on stderr) or "json" (on stdout, one JSON
/// object per line: time (UTC), level, thread, msg and, for LogEvent, its fields as top-level
/// keys; stdout then carries nothing else, the banner included) at `level` (trace..critical,
/// off). INVALID_ARGUMENT for unknown values. Call once at start, before other threads log.
absl::Status InitLogging(absl::string_view format, absl::string_view level);

/// True after InitLogging("json", …).
bool LogIsJson();

/// One field of a structured log event.
struct LogField {
  absl::string_view key;
  std::variant<absl::string_view, int64_t, double> value;
};

/// Logs `msg` with `fields` as top-level keys in JSON (numbers as numbers), or as
/// `msg key=value …` in text (values with spaces or quotes quoted).
void LogEvent(spdlog::level::level_enum level, absl::string_view msg,
              absl::Span<const LogField> fields);
/// JSON-escapes `text` (without the quotes), appending to `out`.
void AppendJsonEscaped(std::string& out, absl::string_view text);

/// Routes libprotobuf's own log (e.g. "String field ... contains invalid UTF-8 data", once per
/// malformed request) into the default logger as LogEvent lines (`source=libprotobuf`,
/// `at=file:line`), instead of its raw lines on stderr. At most `max_lines_per_second` lines a
/// second (FATAL ones always): the line that reaches the limit says so, and the first line of a
/// later second is preceded by one "suppressed N" line. Thread-safe once installed; call it
/// once at start, after InitLogging and before any thread parses protobufs (protobuf's
/// SetLogHandler is not thread-safe).
void RouteProtobufLogging(int max_lines_per_second = 10);

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
