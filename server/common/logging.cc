#include "server/common/logging.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// Marks a payload that LogEvent already rendered as JSON members ("msg":…,"key":…).
constexpr char kFieldsMark = '\x1f';

bool g_json = false;

// `%*`: "msg":"<the message, escaped>", or a LogEvent payload's members as they are.
class JsonMembers final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    absl::string_view payload(msg.payload.data(), msg.payload.size());
    if (!payload.empty() && payload.front() == kFieldsMark) {
      payload.remove_prefix(1);
      dest.append(payload);
      return;
    }
    std::string escaped = "\"msg\":\"";
    AppendJsonEscaped(escaped, payload);
    escaped.push_back('"');
    dest.append(absl::string_view(escaped));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMembers>();
  }
};

void AppendTextValue(std::string& out, absl::string_view value) {
  bool plain = !value.empty();
  for (char c : value) plain = plain && c != ' ' && c != '"' && c != '=' && c >= 0x20;
  if (plain) {
    out.append(value.data(), value.size());
    return;
  }
  out.push_back('"');
  AppendJsonEscaped(out, value);
  out.push_back('"');
}

// The rate limit of RouteProtobufLogging: a fixed one-second window.
struct ProtobufLogLimit {
  absl::Mutex mu;
  std::atomic<int> max_per_second{10};
  int64_t window ABSL_GUARDED_BY(mu) = 0;  // the second being counted
  int logged ABSL_GUARDED_BY(mu) = 0;      // lines logged in it
  int64_t suppressed ABSL_GUARDED_BY(mu) = 0;
};

ProtobufLogLimit& protobuf_log_limit() {
  static ProtobufLogLimit* const limit = new ProtobufLogLimit();
  return *limit;
}

void LogFromProtobuf(google::protobuf::LogLevel level, const char* filename, int line,
                     const std::string& message) {
  spdlog::level::level_enum spd = spdlog::level::err;
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      spd = spdlog::level::info;
      break;
    case google::protobuf::LOGLEVEL_WARNING:
      spd = spdlog::level::warn;
      break;
    case google::protobuf::LOGLEVEL_ERROR:
      spd = spdlog::level::err;
      break;
    case google::protobuf::LOGLEVEL_FATAL:
      spd = spdlog::level::critical;
      break;
  }
  int64_t suppressed = 0;  // to report before this line
  bool last_one = false;   // this line reaches the limit
  if (spd != spdlog::level::critical) {
    ProtobufLogLimit& limit = protobuf_log_limit();
    const int64_t now = absl::ToUnixSeconds(absl::Now());
    absl::MutexLock lock(&limit.mu);
    if (now != limit.window) {
      suppressed = std::exchange(limit.suppressed, 0);
      limit.window = now;
      limit.logged = 0;
    }
    if (limit.logged >= limit.max_per_second) {
      ++limit.suppressed;
      return;
    }
    last_one = ++limit.logged == limit.max_per_second;
  }
  if (suppressed > 0) {
    LogEvent(spdlog::level::warn,
             absl::StrCat("suppressed ", suppressed, " line(s) of protobuf's log (at most ",
                          protobuf_log_limit().max_per_second.load(), " a second)"),
             {{"source", "libprotobuf"}});
  }
  // One line per message, whatever protobuf put in it.
  std::string text(absl::StripTrailingAsciiWhitespace(message));
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (last_one) {
    absl::StrAppend(
        &text, " (rate limit reached: protobuf's log is suppressed for the rest of this second)");
  }
  const std::string at = absl::StrCat(filename != nullptr ? filename : "?", ":", line);
  LogEvent(spd, text, {{"source", "libprotobuf"}, {"at", at}});
}

}  // namespace

void RouteProtobufLogging(int max_lines_per_second) {
  protobuf_log_limit().max_per_second = std::max(1, max_lines_per_second);
  google::protobuf::SetLogHandler(&LogFromProtobuf);
}

absl::Status InitLogging(absl::string_view format, absl::string_view level) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_level=", level,
                     ": allowed values are trace, debug, info, warn, error, "
                     "critical, off"));
  }
  spdlog::sink_ptr sink;
  if (format == "json") {
    sink = std::make_shared<spdlog::sinks::stdout_sink_mt>();
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc,
                                                                 std::string("\n"));
    formatter->add_flag<JsonMembers>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","thread":%t,%*})");
    sink->set_formatter(std::move(formatter));
    g_json = true;
  } else if (format == "text") {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    sink->set_pattern("%Y-%m-%d %H:%M:%S.%e %L %t %v");
    g_json = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format=", format, ": allowed values are text, json"));
  }
  auto logger = std::make_shared<spdlog::logger>("tessera", std::move(sink));
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

bool LogIsJson() { return g_json; }

void AppendJsonEscaped(std::string& out, absl::string_view text) {
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out.append(buf, 6);
        } else {
          out.push_back(c);
        }
    }
  }
}

void LogEvent(spdlog::level::level_enum level, absl::string_view msg,
              absl::Span<const LogField> fields) {
  if (!spdlog::should_log(level)) return;
  std::string line;
  if (g_json) {
    line.push_back(kFieldsMark);
    line += "\"msg\":\"";
    AppendJsonEscaped(line, msg);
    line.push_back('"');
    for (const LogField& f : fields) {
      line += ",\"";
      AppendJsonEscaped(line, f.key);
      line += "\":";
      if (const auto* s = std::get_if<absl::string_view>(&f.value)) {
        line.push_back('"');
        AppendJsonEscaped(line, *s);
        line.push_back('"');
      } else if (const auto* i = std::get_if<int64_t>(&f.value)) {
        absl::StrAppend(&line, *i);
      } else {
        absl::StrAppend(&line, absl::StrFormat("%.3f", std::get<double>(f.value)));
      }
    }
  } else {
    line.assign(msg.data(), msg.size());
    for (const LogField& f : fields) {
      absl::StrAppend(&line, " ", f.key, "=");
      if (const auto* s = std::get_if<absl::string_view>(&f.value)) {
        AppendTextValue(line, *s);
      } else if (const auto* i = std::get_if<int64_t>(&f.value)) {
        absl::StrAppend(&line, *i);
      } else {
        absl::StrAppend(&line, absl::StrFormat("%.3f", std::get<double>(f.value)));
      }
    }
  }
  spdlog::log(level, "{}", line);
}

}  // namespace tessera
