#include "common/byte_size.h"

#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tessera {
namespace {

__extension__ using Uint128 = unsigned __int128;

constexpr uint64_t kMaxSizeBytes = std::numeric_limits<int64_t>::max();

struct SizeUnit {
  absl::string_view name;  // lower case, without a trailing "b"
  SizeUnits units;
  uint64_t multiplier = 1;
};
constexpr SizeUnit kSizeUnits[] = {
    {"", SizeUnits::kBytes, 1},
    {"k", SizeUnits::kDecimal, 1'000},
    {"m", SizeUnits::kDecimal, 1'000'000},
    {"g", SizeUnits::kDecimal, 1'000'000'000},
    {"t", SizeUnits::kDecimal, 1'000'000'000'000},
    {"p", SizeUnits::kDecimal, 1'000'000'000'000'000},
    {"e", SizeUnits::kDecimal, 1'000'000'000'000'000'000},
    {"ki", SizeUnits::kBinary, uint64_t{1} << 10},
    {"mi", SizeUnits::kBinary, uint64_t{1} << 20},
    {"gi", SizeUnits::kBinary, uint64_t{1} << 30},
    {"ti", SizeUnits::kBinary, uint64_t{1} << 40},
    {"pi", SizeUnits::kBinary, uint64_t{1} << 50},
    {"ei", SizeUnits::kBinary, uint64_t{1} << 60},
};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

absl::Status NotASize(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text, "\" is not a size", why, "; write ", kSizeSyntax));
}

}  // namespace

absl::StatusOr<ParsedSize> ParseSize(absl::string_view text) {
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  while (i < s.size() && IsDigit(s[i])) ++i;
  const absl::string_view whole = s.substr(0, i);
  absl::string_view fraction;
  if (i < s.size() && s[i] == '.') {
    const size_t begin = ++i;
    while (i < s.size() && IsDigit(s[i])) ++i;
    fraction = s.substr(begin, i - begin);
  }
  if (whole.empty() && fraction.empty()) {
    return NotASize(text, absl::StartsWith(s, "-") ? " (negative)" : "");
  }
  const absl::string_view written_unit = absl::StripLeadingAsciiWhitespace(s.substr(i));
  if (written_unit == "m") {
    return NotASize(text, " (m is milli in Kubernetes; write M for 10^6 bytes or Mi for 2^20)");
  }
  const std::string lower = absl::AsciiStrToLower(written_unit);
  absl::string_view unit = lower;
  if (unit != "b") absl::ConsumeSuffix(&unit, "b");
  if (unit == "b") unit = "";
  const SizeUnit* found = nullptr;
  for (const SizeUnit& u : kSizeUnits) {
    if (u.name == unit) found = &u;
  }
  if (found == nullptr) {
    return NotASize(text, absl::StrCat(" (unknown unit \"", written_unit, "\")"));
  }

  uint64_t whole_value = 0;
  if (!whole.empty() && (whole.size() > 19 || !absl::SimpleAtoi(whole, &whole_value))) {
    return NotASize(text, " (more than 2^63-1 bytes)");
  }
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (fraction.size() > 18) return NotASize(text, " (too many decimals)");
  uint64_t fraction_value = 0;
  uint64_t fraction_scale = 1;
  for (char c : fraction) {
    fraction_value = fraction_value * 10 + static_cast<uint64_t>(c - '0');
    fraction_scale *= 10;
  }
  const Uint128 whole_bytes = Uint128{whole_value} * found->multiplier;
  const Uint128 fraction_bytes = Uint128{fraction_value} * found->multiplier;
  if (fraction_bytes % fraction_scale != 0) {
    return NotASize(text, " (not a whole number of bytes)");
  }
  const Uint128 bytes = whole_bytes + fraction_bytes / fraction_scale;
  if (bytes > kMaxSizeBytes) return NotASize(text, " (more than 2^63-1 bytes)");
  return ParsedSize{.bytes = static_cast<uint64_t>(bytes), .units = found->units};
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::StatusOr<ParsedSize> size = ParseSize(text);
  if (!size.ok()) return size.status();
  return size->bytes;
}

bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error) {
  absl::StatusOr<uint64_t> parsed = ParseByteSize(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  out->bytes = *parsed;
  return true;
}

std::string AbslUnparseFlag(ByteSize value) { return absl::StrCat(value.bytes); }

}  // namespace tessera
