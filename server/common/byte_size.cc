#include "server/common/byte_size.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < s.size() && (absl::ascii_isdigit(s[split]) || s[split] == '.')) ++split;
  absl::string_view number = s.substr(0, split);
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(split)));
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a byte size (examples: 1048576, 512MiB, 1.5GiB)"));
  };
  if (number.empty()) return bad();
  int shift = 0;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else {
    static constexpr absl::string_view kPrefixes = "kmgtp";
    size_t p = kPrefixes.find(unit[0]);
    if (p == absl::string_view::npos) return bad();
    absl::string_view rest = absl::string_view(unit).substr(1);
    if (!rest.empty() && rest != "i" && rest != "ib" && rest != "b") return bad();
    shift = 10 * static_cast<int>(p + 1);
  }
  if (number.find('.') == absl::string_view::npos) {
    uint64_t value = 0;
    if (!absl::SimpleAtoi(number, &value)) return bad();
    if (shift > 0 && value > (uint64_t{1} << (63 - shift))) return bad();
    return value << shift;
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value)) return bad();
  double bytes = std::ldexp(value, shift);
  if (bytes > std::ldexp(1.0, 63)) return bad();
  return static_cast<uint64_t>(bytes);
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
