#ifndef TESSERA_KERNELS_EXPR_LEXER_H_
#define TESSERA_KERNELS_EXPR_LEXER_H_

// Internal to kernels/expr (compile.cc, source.cc): the tokens of the kernel language and of
// the .tk file header (docs/kernels.md, "Lexical structure"). Not a public API.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tessera::kernels::expr::internal {

enum class TokenKind : uint8_t {
  kEnd,      // the end of the text
  kNewline,  // '\n' (statements end there)
  kName,     // [A-Za-z_][A-Za-z0-9_]*
  kInt,      // decimal digits that fit in int64: `int_value`
  kFloat,    // a decimal with '.' or an exponent, finite in f64: `float_value`
  kPunct,    // an operator or delimiter, `text` (e.g. "<=", "(", "->")
  kError,    // a lexical error: `error` says what; the position is where it starts
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  /// The token's bytes (a view into the lexed text).
  absl::string_view text;
  /// 1-based; columns count bytes.
  int line = 1, column = 1;
  int64_t int_value = 0;
  double float_value = 0;
  std::string error;
};

/// Splits text into tokens one at a time. Spaces, tabs, '\r' and `#` comments (to the end of
/// the line, the newline excluded) separate tokens. After a kError or kEnd token, Next()
/// keeps returning kEnd. Never recurses; every call is O(length of the token).
class Lexer {
 public:
  /// `line`/`column`: the position of text[0] (for lexing a part of a larger text).
  explicit Lexer(absl::string_view text, int line = 1, int column = 1)
      : text_(text), line_(line), column_(column) {}

  Token Next();

  /// Bytes consumed so far (just after the last token returned).
  size_t offset() const { return pos_; }

 private:
  void Advance(size_t n);
  Token Number(Token token);

  absl::string_view text_;
  size_t pos_ = 0;
  int line_, column_;
  bool done_ = false;
};

/// `text` clipped to `max_bytes` (with "..." when clipped) and C-escaped, for messages that
/// quote a tenant's text.
std::string Clip(absl::string_view text, size_t max_bytes = 40);

/// How a message names the token found: "'x'", "the end of the line", or `end` for kEnd.
std::string Describe(const Token& token, absl::string_view end);

}  // namespace tessera::kernels::expr::internal

#endif  // TESSERA_KERNELS_EXPR_LEXER_H_
