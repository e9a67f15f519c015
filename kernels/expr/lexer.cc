#include "kernels/expr/lexer.h"

#include <algorithm>
#include <charconv>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tessera::kernels::expr::internal {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Longest first, so "<=" is not read as "<" then "=".
constexpr absl::string_view kPunctuation[] = {
    "->", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "(", ")", ",", "+", "-", "*", "/",
    "%",  "<",  ">",  "!",  "=",  ";",  ":",  "[",  "]",  "{", "}", "&", "|", "^", "~"};

// Whether a decimal literal that from_chars found out of range is too large (else too
// small): the decimal exponent of its first significant digit is positive.
bool TooLarge(absl::string_view literal) {
  size_t e = literal.find_first_of("eE");
  absl::string_view mantissa = literal.substr(0, e);
  int64_t exponent = 0;
  if (e != absl::string_view::npos) {
    absl::string_view digits = literal.substr(e + 1);
    bool negative = !digits.empty() && digits[0] == '-';
    if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) digits.remove_prefix(1);
    for (char c : digits) exponent = std::min<int64_t>(exponent * 10 + (c - '0'), 1'000'000);
    if (negative) exponent = -exponent;
  }
  size_t point = mantissa.find('.');
  absl::string_view whole = mantissa.substr(0, point);
  absl::string_view fraction =
      point == absl::string_view::npos ? absl::string_view() : mantissa.substr(point + 1);
  while (!whole.empty() && whole[0] == '0') whole.remove_prefix(1);
  if (!whole.empty()) return static_cast<int64_t>(whole.size()) - 1 + exponent > 0;
  size_t zeros = fraction.find_first_not_of('0');
  return -static_cast<int64_t>(zeros) - 1 + exponent > 0;
}

}  // namespace

std::string Clip(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, max_bytes)), "...");
}

std::string Describe(const Token& token, absl::string_view end) {
  switch (token.kind) {
    case TokenKind::kEnd:
      return std::string(end);
    case TokenKind::kNewline:
      return "the end of the line";
    case TokenKind::kName:
    case TokenKind::kInt:
    case TokenKind::kFloat:
    case TokenKind::kPunct:
    case TokenKind::kError:
      break;
  }
  return absl::StrCat("'", Clip(token.text), "'");
}

void Lexer::Advance(size_t n) {
  for (size_t end = pos_ + n; pos_ < end; ++pos_) {
    if (text_[pos_] == '\n') {
      ++line_;
      column_ = 1;
    } else {
      ++column_;
    }
  }
}

Token Lexer::Next() {
  while (!done_ && pos_ < text_.size()) {
    char c = text_[pos_];
    if (c == ' ' || c == '\t' || c == '\r') {
      Advance(1);
    } else if (c == '#') {
      size_t newline = text_.find('\n', pos_);
      Advance((newline == absl::string_view::npos ? text_.size() : newline) - pos_);
    } else {
      break;
    }
  }
  Token token;
  token.line = line_;
  token.column = column_;
  if (done_ || pos_ == text_.size()) {
    done_ = true;
    return token;  // kEnd
  }
  const char c = text_[pos_];
  if (c == '\n') {
    token.kind = TokenKind::kNewline;
    token.text = text_.substr(pos_, 1);
    Advance(1);
    return token;
  }
  if (IsNameStart(c)) {
    size_t end = pos_ + 1;
    while (end < text_.size() && IsNameChar(text_[end])) ++end;
    token.kind = TokenKind::kName;
    token.text = text_.substr(pos_, end - pos_);
    Advance(end - pos_);
    return token;
  }
  if (IsDigit(c) || (c == '.' && pos_ + 1 < text_.size() && IsDigit(text_[pos_ + 1]))) {
    return Number(std::move(token));
  }
  for (absl::string_view punct : kPunctuation) {
    if (absl::StartsWith(text_.substr(pos_), punct)) {
      token.kind = TokenKind::kPunct;
      token.text = text_.substr(pos_, punct.size());
      Advance(punct.size());
      return token;
    }
  }
  token.kind = TokenKind::kError;
  token.text = text_.substr(pos_, 1);
  if (c > ' ' && c < 0x7f) {
    token.error = absl::StrCat("unexpected character '", token.text, "'");
  } else {
    token.error = absl::StrCat("unexpected byte 0x",
                               absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
  }
  done_ = true;
  return token;
}

Token Lexer::Number(Token token) {
  const size_t start = pos_;
  size_t i = pos_;
  auto digits = [&] {
    while (i < text_.size() && IsDigit(text_[i])) ++i;
  };
  digits();
  bool is_float = false;
  if (i < text_.size() && text_[i] == '.') {
    is_float = true;
    ++i;
    digits();
  }
  if (i < text_.size() && (text_[i] == 'e' || text_[i] == 'E')) {
    size_t j = i + 1;
    if (j < text_.size() && (text_[j] == '+' || text_[j] == '-')) ++j;
    if (j < text_.size() && IsDigit(text_[j])) {
      is_float = true;
      i = j;
      digits();
    }
  }
  if (i < text_.size() && (IsNameChar(text_[i]) || text_[i] == '.')) {
    while (i < text_.size() && (IsNameChar(text_[i]) || text_[i] == '.')) ++i;
    token.kind = TokenKind::kError;
    token.text = text_.substr(start, i - start);
    token.error = absl::StrCat("malformed number '", Clip(token.text),
                               "' (numbers are 12, 1.5, .5, 1e-3 or 2.5E+4)");
    done_ = true;
    return token;
  }
  token.text = text_.substr(start, i - start);
  const char* first = token.text.data();
  const char* last = first + token.text.size();
  if (!is_float) {
    token.kind = TokenKind::kInt;
    auto [ptr, ec] = std::from_chars(first, last, token.int_value);
    if (ec != std::errc() || ptr != last) {
      token.kind = TokenKind::kError;
      token.error = absl::StrCat("the integer ", Clip(token.text),
                                 " does not fit in i64 (the largest is 9223372036854775807)");
      done_ = true;
      return token;
    }
  } else {
    token.kind = TokenKind::kFloat;
    auto [ptr, ec] = std::from_chars(first, last, token.float_value);
    if (ec != std::errc() || ptr != last) {
      token.kind = TokenKind::kError;
      token.error =
          TooLarge(token.text)
              ? absl::StrCat("the number ", Clip(token.text),
                             " is too large for f64 (the largest is 1.7976931348623157e+308)")
              : absl::StrCat("the number ", Clip(token.text),
                             " is too small for f64: it would round to 0 (the smallest "
                             "positive is 4.9406564584124654e-324); write 0");
      done_ = true;
      return token;
    }
  }
  Advance(i - start);
  return token;
}

}  // namespace tessera::kernels::expr::internal
