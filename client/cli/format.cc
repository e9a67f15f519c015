#include "client/cli/format.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera::cli {
namespace {

// `value` with three significant digits, trailing zeros dropped: 24.75 -> "24.8", 2 -> "2".
std::string ThreeDigits(double value) {
  std::string text = absl::StrFormat(value < 10 ? "%.2f" : value < 100 ? "%.1f" : "%.0f", value);
  if (text.find('.') != std::string::npos) {
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
  }
  return text;
}

// "m:ss" or "h:mm:ss".
std::string Clock(absl::Duration duration) {
  const int64_t total = absl::ToInt64Seconds(absl::Ceil(duration, absl::Seconds(1)));
  const int64_t hours = total / 3600;
  const int64_t minutes = total / 60 % 60;
  const int64_t seconds = total % 60;
  return hours > 0 ? absl::StrFormat("%d:%02d:%02d", hours, minutes, seconds)
                   : absl::StrFormat("%d:%02d", minutes, seconds);
}

}  // namespace

std::string GroupThousands(uint64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string FormatBytes(uint64_t bytes, SizeUnits units) {
  static constexpr const char* kBinaryNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  static constexpr const char* kDecimalNames[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  const bool decimal = units == SizeUnits::kDecimal;
  const uint64_t base = decimal ? 1000 : 1024;
  const char* const* names = decimal ? kDecimalNames : kBinaryNames;
  int unit = 0;
  uint64_t scale = 1;
  while (unit < 6 && bytes / scale >= base) {
    scale *= base;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  if (bytes % scale == 0) return absl::StrCat(bytes / scale, " ", names[unit]);
  const double value = static_cast<double>(bytes) / static_cast<double>(scale);
  // 1023.96 MiB rounds to "1024.0 MiB": say "1.0 GiB" instead.
  if (std::round(value * 10) >= static_cast<double>(base * 10) && unit < 6) {
    return absl::StrFormat("%.1f %s", value / static_cast<double>(base), names[unit + 1]);
  }
  return absl::StrFormat("%.1f %s", value, names[unit]);
}

std::string FormatBytesExact(uint64_t bytes, SizeUnits units) {
  if (bytes < 1000) return absl::StrCat(bytes, bytes == 1 ? " byte" : " bytes");
  return absl::StrCat(FormatBytes(bytes, units), " (", GroupThousands(bytes), " bytes)");
}

std::string FormatUtc(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

std::string HumanDuration(absl::Duration duration) {
  if (duration < absl::ZeroDuration()) return absl::StrCat("-", HumanDuration(-duration));
  if (duration == absl::InfiniteDuration()) return "inf";
  if (duration == absl::ZeroDuration()) return "0 s";
  struct Unit {
    absl::Duration size;
    const char* name;
  };
  static const Unit kUnits[] = {{absl::Nanoseconds(1), "ns"},
                                {absl::Microseconds(1), "µs"},
                                {absl::Milliseconds(1), "ms"},
                                {absl::Seconds(1), "s"}};
  for (size_t i = 0; i < 4; ++i) {
    const double value = absl::FDivDuration(duration, kUnits[i].size);
    // Below 1000 of this unit, unless it would print as "1000" (then the next unit).
    if (i == 3 ? value < 59.95 : value < 999.5) {
      return absl::StrCat(ThreeDigits(value), " ", kUnits[i].name);
    }
  }
  const int64_t total =
      absl::ToInt64Seconds(absl::Floor(duration + absl::Milliseconds(500), absl::Seconds(1)));
  const int64_t hours = total / 3600;
  if (hours >= 24) return absl::StrFormat("%dd%02dh", hours / 24, hours % 24);
  if (hours > 0) return absl::StrFormat("%dh%02dm%02ds", hours, total / 60 % 60, total % 60);
  return absl::StrFormat("%dm%02ds", total / 60, total % 60);
}

std::string FormatRate(uint64_t bytes, absl::Duration elapsed) {
  if (elapsed <= absl::ZeroDuration()) return "-";
  const double per_second = static_cast<double>(bytes) / absl::ToDoubleSeconds(elapsed);
  return absl::StrCat(FormatBytes(static_cast<uint64_t>(per_second)), "/s");
}

std::string FormatProgress(absl::string_view label, uint64_t done, uint64_t total,
                           absl::Duration elapsed) {
  constexpr int kWidth = 20;
  const double fraction = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar.push_back('>');
  bar.resize(kWidth, ' ');
  const int percent = static_cast<int>(fraction * 100);
  if (done >= total) {
    return absl::StrFormat("%s [%s] 100%%  %s in %s (%s)", label, bar, FormatBytes(total),
                           HumanDuration(elapsed), FormatRate(total, elapsed));
  }
  std::string eta = "--:--";
  if (done > 0 && elapsed > absl::ZeroDuration()) {
    eta = Clock(elapsed * (static_cast<double>(total - done) / static_cast<double>(done)));
  }
  return absl::StrFormat("%s [%s] %3d%%  %s / %s  %s  ETA %s", label, bar, percent,
                         FormatBytes(done), FormatBytes(total), FormatRate(done, elapsed), eta);
}

}  // namespace tessera::cli
