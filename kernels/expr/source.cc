// The text form of a kernel definition (compile.h: ParseSource, FormatDefinition).
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "kernels/expr/compile.h"
#include "kernels/expr/lexer.h"
#include "kernels/shape.h"

namespace tessera::kernels::expr {
namespace {

using internal::Lexer;
using internal::Token;
using internal::TokenKind;

// Shortest text that reads back as the same double (an integer for int parameters).
std::string FormatNumber(double v, bool integer) {
  char buffer[64];
  std::to_chars_result r =
      integer && v == std::trunc(v) && std::fabs(v) < 9.2e18
          ? std::to_chars(buffer, buffer + sizeof buffer, static_cast<int64_t>(v))
          : std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, r.ptr);
}

void AppendOperands(std::string& out, const std::vector<OperandDef>& operands) {
  for (size_t i = 0; i < operands.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", operands[i].name, ": ", DTypeName(operands[i].dtype));
    if (operands[i].rank >= 0) absl::StrAppend(&out, "[", operands[i].rank, "]");
  }
}

class SourceParser {
 public:
  explicit SourceParser(absl::string_view source) : source_(source), lexer_(source) { Advance(); }

  absl::StatusOr<Definition> Parse();

 private:
  // Newlines do not matter in the header.
  void Advance() {
    do {
      token_ = lexer_.Next();
    } while (token_.kind == TokenKind::kNewline);
  }
  bool IsPunct(absl::string_view text) const {
    return token_.kind == TokenKind::kPunct && token_.text == text;
  }
  bool IsWord(absl::string_view text) const {
    return token_.kind == TokenKind::kName && token_.text == text;
  }
  absl::Status ErrorAt(int line, int column, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ":", column, ": ", message));
  }
  absl::Status Expected(absl::string_view what) const {
    if (token_.kind == TokenKind::kError) return ErrorAt(token_.line, token_.column, token_.error);
    return ErrorAt(token_.line, token_.column,
                   absl::StrCat("expected ", what, ", found ",
                                internal::Describe(token_, "the end of the file")));
  }
  absl::Status Punct(absl::string_view text, absl::string_view where) {
    if (!IsPunct(text)) return Expected(absl::StrCat("'", text, "' ", where));
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Name(absl::string_view what) {
    if (token_.kind != TokenKind::kName) return Expected(what);
    std::string name(token_.text);
    Advance();
    return name;
  }
  absl::Status Operands(std::vector<OperandDef>& operands, absl::string_view kind);
  absl::Status Params(std::vector<ScalarDef>& params);
  absl::Status Body(std::string& body);

  absl::string_view source_;
  Lexer lexer_;
  Token token_;
};

absl::StatusOr<Definition> SourceParser::Parse() {
  Definition d;
  if (!IsWord("kernel")) return Expected("'kernel' to start the definition");
  Advance();
  absl::StatusOr<std::string> name = Name("the kernel's name after 'kernel'");
  if (!name.ok()) return name.status();
  d.name = *std::move(name);
  if (absl::Status s = Punct("(", "before the inputs"); !s.ok()) return s;
  if (absl::Status s = Operands(d.inputs, "input"); !s.ok()) return s;
  if (absl::Status s = Punct("->", "after the inputs"); !s.ok()) return s;
  if (absl::Status s = Punct("(", "before the outputs"); !s.ok()) return s;
  if (absl::Status s = Operands(d.outputs, "output"); !s.ok()) return s;
  if (IsWord("params")) {
    Advance();
    if (absl::Status s = Punct("(", "after 'params'"); !s.ok()) return s;
    if (absl::Status s = Params(d.params); !s.ok()) return s;
  }
  if (!IsPunct("{")) return Expected("'params(...)' or '{' to open the body");
  if (absl::Status s = Body(d.body); !s.ok()) return s;
  return d;
}

// Operands up to and including the closing ')': NAME ':' DTYPE ('[' RANK ']')?, ...
absl::Status SourceParser::Operands(std::vector<OperandDef>& operands, absl::string_view kind) {
  if (IsPunct(")")) {
    Advance();
    return absl::OkStatus();
  }
  while (true) {
    OperandDef operand;
    absl::StatusOr<std::string> name = Name(absl::StrCat("the name of an ", kind));
    if (!name.ok()) return name.status();
    operand.name = *std::move(name);
    if (absl::Status s = Punct(":", absl::StrCat("after ", kind, " ", operand.name)); !s.ok()) {
      return s;
    }
    std::optional<DType> dtype =
        token_.kind == TokenKind::kName ? DTypeFromName(token_.text) : std::nullopt;
    if (!dtype.has_value()) {
      return Expected(absl::StrCat("the dtype of ", operand.name,
                                   " (f32, f16, bf16, f64, i32, i64, u8 or bool)"));
    }
    operand.dtype = *dtype;
    Advance();
    if (IsPunct("[")) {
      Advance();
      if (token_.kind != TokenKind::kInt || token_.int_value > static_cast<int64_t>(kMaxRank)) {
        return Expected(absl::StrCat("the rank of ", operand.name, " (0 to ", kMaxRank,
                                     "; leave out [...] for any rank)"));
      }
      operand.rank = static_cast<int>(token_.int_value);
      Advance();
      if (absl::Status s = Punct("]", "after the rank"); !s.ok()) return s;
    }
    operands.push_back(std::move(operand));
    if (IsPunct(",")) {
      Advance();
      continue;
    }
    return Punct(")", absl::StrCat("or ',' after ", kind, " ", operands.back().name));
  }
}

// Parameters up to and including the closing ')': NAME ':' (float|int) ('=' '-'? NUMBER)?, ...
absl::Status SourceParser::Params(std::vector<ScalarDef>& params) {
  if (IsPunct(")")) {
    Advance();
    return absl::OkStatus();
  }
  while (true) {
    ScalarDef param;
    absl::StatusOr<std::string> name = Name("the name of a parameter");
    if (!name.ok()) return name.status();
    param.name = *std::move(name);
    if (absl::Status s = Punct(":", absl::StrCat("after parameter ", param.name)); !s.ok()) {
      return s;
    }
    if (!IsWord("float") && !IsWord("int")) {
      return Expected(absl::StrCat("the kind of parameter ", param.name, " (float or int)"));
    }
    param.kind = token_.text == "int" ? ScalarKind::kInt : ScalarKind::kFloat;
    Advance();
    if (IsPunct("=")) {
      Advance();
      const bool negative = IsPunct("-");
      if (negative) Advance();
      const bool is_int = param.kind == ScalarKind::kInt;
      if (token_.kind != TokenKind::kInt && (is_int || token_.kind != TokenKind::kFloat)) {
        return Expected(
            absl::StrCat("the default of ", param.name, is_int ? " (an integer)" : " (a number)"));
      }
      double v = token_.kind == TokenKind::kInt ? static_cast<double>(token_.int_value)
                                                : token_.float_value;
      param.default_value = negative ? -v : v;
      Advance();
    }
    params.push_back(std::move(param));
    if (IsPunct(",")) {
      Advance();
      continue;
    }
    return Punct(")", absl::StrCat("or ',' after parameter ", params.back().name));
  }
}

// The body: the bytes after '{' up to the first '}' outside a comment, less one newline at
// each end (FormatDefinition puts them there); then only blanks and comments may follow.
absl::Status SourceParser::Body(std::string& body) {
  const Token open = token_;
  const size_t begin = lexer_.offset();  // just past '{': the lexer has read nothing more
  size_t end = begin;
  while (end < source_.size() && source_[end] != '}') {
    if (source_[end] == '#') {
      end = source_.find('\n', end);
      if (end == absl::string_view::npos) end = source_.size();
    } else {
      ++end;
    }
  }
  if (end >= source_.size()) {
    return ErrorAt(open.line, open.column, "the body's '{' has no closing '}'");
  }
  absl::string_view text = source_.substr(begin, end - begin);
  if (!text.empty() && text.front() == '\n') text.remove_prefix(1);
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  body = std::string(text);

  int line = 1, column = 1;
  for (size_t i = 0; i <= end; ++i) {
    if (source_[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  Lexer rest(source_.substr(end + 1), line, column);
  do {
    token_ = rest.Next();
  } while (token_.kind == TokenKind::kNewline);
  if (token_.kind != TokenKind::kEnd) {
    return Expected("the end of the file after the body's closing '}'");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Definition> ParseSource(absl::string_view source) {
  return SourceParser(source).Parse();
}

std::string FormatDefinition(const Definition& definition) {
  std::string out = absl::StrCat("kernel ", definition.name, "(");
  AppendOperands(out, definition.inputs);
  absl::StrAppend(&out, ") -> (");
  AppendOperands(out, definition.outputs);
  absl::StrAppend(&out, ")\n");
  if (!definition.params.empty()) {
    absl::StrAppend(&out, "  params(");
    for (size_t i = 0; i < definition.params.size(); ++i) {
      const ScalarDef& p = definition.params[i];
      const bool is_int = p.kind == ScalarKind::kInt;
      absl::StrAppend(&out, i == 0 ? "" : ", ", p.name, ": ", is_int ? "int" : "float");
      if (p.default_value.has_value()) {
        absl::StrAppend(&out, " = ", FormatNumber(*p.default_value, is_int));
      }
    }
    absl::StrAppend(&out, ")\n");
  }
  absl::StrAppend(&out, "{\n", definition.body, "\n}\n");
  return out;
}

}  // namespace tessera::kernels::expr
