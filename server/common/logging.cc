#include "server/common/logging.h"

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// `%*`: the message, escaped for a JSON string.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    for (char c : msg.payload) {
      switch (c) {
        case '"':
          dest.append(absl::string_view("\\\""));
          break;
        case '\\':
          dest.append(absl::string_view("\\\\"));
          break;
        case '\n':
          dest.append(absl::string_view("\\n"));
          break;
        case '\r':
          dest.append(absl::string_view("\\r"));
          break;
        case '\t':
          dest.append(absl::string_view("\\t"));
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            dest.append(absl::string_view(buf, 6));
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

}  // namespace

absl::Status InitLogging(absl::string_view format, absl::string_view level) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_level=", level,
                     ": allowed values are trace, debug, info, warn, error, "
                     "critical, off"));
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc,
                                                                 std::string("\n"));
    formatter->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","thread":%t,"msg":"%*"})");
    sink->set_formatter(std::move(formatter));
  } else if (format == "text") {
    sink->set_pattern("%Y-%m-%d %H:%M:%S.%e %L %t %v");
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

}  // namespace tessera
