#include "kernels/expr/compile.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <openssl/evp.h>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "kernels/expr/lexer.h"
#include "kernels/expr/names.h"

namespace tessera::kernels::expr {
namespace {

using internal::Callee;
using internal::Clip;

using internal::FindFunction;
using internal::Function;
using internal::IsFloat;
using internal::IsReserved;
using internal::Lexer;
using internal::NameProblem;
using internal::Suggest;
using internal::Token;
using internal::TokenKind;
using internal::TypeName;
using internal::U8;

absl::Status Invalid(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

// The float nearest to `v` (round to nearest even, overflow to infinity), without the
// undefined behaviour of converting an out-of-range double to float.
double RoundToF32(double v) {
  if (std::isfinite(v) && std::fabs(v) > static_cast<double>(FLT_MAX)) {
    // Past FLT_MAX by half an ulp (2^103) or more rounds to infinity (the tie goes to the
    // even significand, infinity's).
    const double halfway = static_cast<double>(FLT_MAX) + std::ldexp(1.0, 103);
    double magnitude = std::fabs(v) >= halfway ? HUGE_VAL : static_cast<double>(FLT_MAX);
    return std::copysign(magnitude, v);
  }
  return static_cast<double>(static_cast<float>(v));
}

// ---- The checker: parses the body and builds a typed graph --------------------------------

// A checked subexpression: a slot of the graph and whether its type is weak (a literal, a
// parameter or a computation of only those, which takes the type of the strong operand it
// meets; docs/kernels.md, "Types").
struct Value {
  int32_t slot = -1;
  bool weak = false;
};

struct Slot {
  Node node;  // args are slot indices
  /// An input the value depends on (the first found), or -1.
  int32_t input = -1;
};

enum class SymbolKind : uint8_t { kInput, kOutput, kParam, kLet };

struct Symbol {
  SymbolKind kind;
  int32_t index = 0;  // operand or parameter index
  Value value;        // for a let
  int line = 0, column = 0;
};

// What is known about the statement being parsed.
struct Statement {
  bool in_let = false;
  bool may_reduce = false;                // the output statement of a one-output kernel
  const Token* open_reduction = nullptr;  // while parsing a reduction's argument
  // The reduction, once parsed.
  int32_t reduced = -1;
  Combine combine = Combine::kSum;
  const Token* reduction = nullptr;
  // The first use, outside a reduction's argument, of count and of an input.
  const Token* count_use = nullptr;
  const Token* input_use = nullptr;
};

// The body, checked: the graph in topological order (every arg before its user), the value of
// each output and the reduction, if any.
struct Checked {
  std::vector<Slot> slots;
  std::vector<int32_t> results;
  int32_t reduced = -1;  // the kReduced placeholder slot (its args: {map})
  Combine combine = Combine::kSum;
};

class Checker {
 public:
  explicit Checker(const Definition& d) : d_(d) {}

  absl::StatusOr<Checked> Run();

 private:
  // Tokens.
  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& Take() {
    const Token& t = Peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool IsPunct(const Token& t, absl::string_view text) const {
    return t.kind == TokenKind::kPunct && t.text == text;
  }
  void Tokenize();
  void PrescanLets();

  // Errors: the first one wins; every parse step returns a failed Value once it is set.
  bool failed() const { return !error_.ok(); }
  Value Fail(const Token& at, absl::string_view message);
  Value Unexpected(const Token& found, absl::string_view expected);

  // Statements.
  void ParseLet();
  void ParseAssignment();
  void CheckOutputType(const Token& name, const OperandDef& output, Value value);

  // Expressions, by precedence.
  Value ParseExpr() { return ParseBinary(0); }
  Value ParseBinary(int level);
  Value ParseUnary();
  Value ParsePrimary();
  Value ParseName(const Token& name);
  Value ParseCall(const Token& name);
  bool Enter(const Token& paren);
  void Leave() { --depth_; }

  // Typed nodes.
  int32_t Add(Node node, int line, int column);
  int32_t Add(Node node, const Token& at) { return Add(std::move(node), at.line, at.column); }
  Value Constant(Type type, int64_t i, double f, bool weak, const Token& at);
  Type TypeOf(Value v) const { return slots_[v.slot].node.type; }
  int32_t Coerce(Value v, Type to);
  Value Unary(const Token& op, Value v);
  Value Binary(const Token& op, Value a, Value b);
  Value BitOperation(const Token& op, Node node, Value a, Value b);
  Value Math(const Function& f, const Token& name, const std::vector<Value>& args);
  Value Where(const Token& name, const std::vector<Value>& args,
              const std::vector<const Token*>& starts);
  Value Reduce(const Function& f, const Token& name, Value map);
  Value InputValue(int32_t index, const Token& at);
  Value ParamValue(int32_t index, const Token& at);
  std::vector<std::string> VisibleNames() const;

  const Definition& d_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  absl::Status error_;
  int depth_ = 0;

  std::vector<Slot> slots_;
  std::map<std::string, Symbol, std::less<>> symbols_;
  std::map<std::string, const Token*, std::less<>> later_lets_;  // every `let NAME`, first
  std::vector<int32_t> input_slots_, param_slots_;
  int32_t count_slot_ = -1;
  std::map<std::pair<int32_t, Type>, int32_t> coerced_;
  std::vector<const Token*> assigned_;  // per output: its statement's name token
  std::vector<int32_t> results_;
  const Token* first_output_ = nullptr;
  Statement st_;
  int32_t reduced_ = -1;  // the reduction's kReduced slot, once parsed
  Combine combine_ = Combine::kSum;
};

void Checker::Tokenize() {
  Lexer lexer(d_.body);
  while (true) {
    tokens_.push_back(lexer.Next());
    if (tokens_.back().kind == TokenKind::kEnd || tokens_.back().kind == TokenKind::kError) break;
  }
}

void Checker::PrescanLets() {
  for (size_t i = 0; i + 1 < tokens_.size(); ++i) {
    const Token& t = tokens_[i];
    if (t.kind == TokenKind::kName && t.text == "let" && tokens_[i + 1].kind == TokenKind::kName) {
      later_lets_.emplace(std::string(tokens_[i + 1].text), &tokens_[i + 1]);
    }
  }
}

Value Checker::Fail(const Token& at, absl::string_view message) {
  if (error_.ok()) {
    error_ = Invalid("body line ", at.line, ":", at.column, ": ", message);
  }
  return Value{};
}

Value Checker::Unexpected(const Token& found, absl::string_view expected) {
  if (found.kind == TokenKind::kError) return Fail(found, found.error);
  return Fail(found, absl::StrCat("expected ", expected, ", found ",
                                  internal::Describe(found, "the end of the body")));
}

absl::StatusOr<Checked> Checker::Run() {
  Tokenize();
  PrescanLets();
  input_slots_.assign(d_.inputs.size(), -1);
  param_slots_.assign(d_.params.size(), -1);
  assigned_.assign(d_.outputs.size(), nullptr);
  results_.assign(d_.outputs.size(), -1);
  for (size_t i = 0; i < d_.inputs.size(); ++i) {
    symbols_[d_.inputs[i].name] = Symbol{SymbolKind::kInput, static_cast<int32_t>(i)};
  }
  for (size_t i = 0; i < d_.outputs.size(); ++i) {
    symbols_[d_.outputs[i].name] = Symbol{SymbolKind::kOutput, static_cast<int32_t>(i)};
  }
  for (size_t i = 0; i < d_.params.size(); ++i) {
    symbols_[d_.params[i].name] = Symbol{SymbolKind::kParam, static_cast<int32_t>(i)};
  }
  bool any_statement = false;
  while (!failed()) {
    while (Peek().kind == TokenKind::kNewline || IsPunct(Peek(), ";")) Take();
    if (Peek().kind == TokenKind::kEnd) break;
    any_statement = true;
    if (Peek().kind == TokenKind::kName && Peek().text == "let") {
      ParseLet();
    } else {
      ParseAssignment();
    }
    if (failed()) break;
    const Token& after = Peek();
    if (after.kind != TokenKind::kNewline && after.kind != TokenKind::kEnd &&
        !IsPunct(after, ";")) {
      Unexpected(after, "an operator, or a new line or ';' after the statement");
    }
  }
  if (failed()) return error_;
  if (!any_statement) {
    return Invalid("body: the body has no statements; assign each output (", d_.outputs[0].name,
                   " = ...)");
  }
  for (size_t i = 0; i < d_.outputs.size(); ++i) {
    if (assigned_[i] == nullptr) {
      return Invalid("body: output ", d_.outputs[i].name, " is never assigned; add a statement ",
                     d_.outputs[i].name, " = ...");
    }
  }
  Checked checked;
  checked.slots = std::move(slots_);
  checked.results = std::move(results_);
  checked.reduced = reduced_;
  checked.combine = combine_;
  return checked;
}

void Checker::ParseLet() {
  const Token& let = Take();
  if (first_output_ != nullptr) {
    Fail(let, absl::StrCat("every let must come before the output assignments; this one follows ",
                           first_output_->text, " = ... at line ", first_output_->line, ":",
                           first_output_->column));
    return;
  }
  const Token& name = Take();
  if (name.kind != TokenKind::kName) {
    Unexpected(name, "a name after 'let'");
    return;
  }
  if (std::string problem = NameProblem(name.text); !problem.empty()) {
    Fail(name, absl::StrCat("let: ", problem));
    return;
  }
  if (IsReserved(name.text)) {
    Fail(name, absl::StrCat("let: ", name.text,
                            " is reserved (a function or keyword of the language); choose "
                            "another name"));
    return;
  }
  if (auto it = symbols_.find(name.text); it != symbols_.end()) {
    const Symbol& s = it->second;
    switch (s.kind) {
      case SymbolKind::kLet:
        Fail(name, absl::StrCat("let ", name.text, " is defined twice (first at line ", s.line, ":",
                                s.column, ")"));
        return;
      case SymbolKind::kInput:
      case SymbolKind::kOutput:
      case SymbolKind::kParam: {
        absl::string_view what = s.kind == SymbolKind::kInput    ? "an input"
                                 : s.kind == SymbolKind::kOutput ? "an output"
                                                                 : "a parameter";
        Fail(name, absl::StrCat("let ", name.text, ": ", name.text, " is already ", what,
                                " of the kernel; choose another name"));
        return;
      }
    }
  }
  if (!IsPunct(Peek(), "=")) {
    Unexpected(Peek(), absl::StrCat("'=' after let ", name.text));
    return;
  }
  Take();
  st_ = Statement{.in_let = true};
  Value v = ParseExpr();
  if (failed()) return;
  symbols_[std::string(name.text)] = Symbol{SymbolKind::kLet, 0, v, name.line, name.column};
}

void Checker::ParseAssignment() {
  const Token& name = Take();
  if (name.kind != TokenKind::kName) {
    Unexpected(name, "a statement (let NAME = EXPR, or OUTPUT = EXPR)");
    return;
  }
  std::vector<std::string> outputs;
  for (const OperandDef& o : d_.outputs) outputs.push_back(o.name);
  auto it = symbols_.find(name.text);
  if (it == symbols_.end()) {
    Fail(name, absl::StrCat(Clip(name.text), " is not an output of the kernel",
                            Suggest(name.text, outputs, "the outputs are")));
    return;
  }
  if (it->second.kind != SymbolKind::kOutput) {
    absl::string_view what =
        it->second.kind == SymbolKind::kInput   ? "is an input; only outputs are assigned"
        : it->second.kind == SymbolKind::kParam ? "is a parameter; only outputs are assigned"
                                                : "is a let; a let cannot be reassigned";
    Fail(name,
         absl::StrCat(name.text, " ", what, " (outputs: ", absl::StrJoin(outputs, ", "), ")"));
    return;
  }
  const int32_t index = it->second.index;
  if (const Token* first = assigned_[index]; first != nullptr) {
    Fail(name, absl::StrCat("output ", name.text, " is assigned twice (first at line ", first->line,
                            ":", first->column, ")"));
    return;
  }
  if (!IsPunct(Peek(), "=")) {
    Unexpected(Peek(), absl::StrCat("'=' after the output ", name.text));
    return;
  }
  Take();
  st_ = Statement{.may_reduce = d_.outputs.size() == 1};
  Value v = ParseExpr();
  if (failed()) return;
  if (st_.reduction != nullptr) {
    const absl::string_view combine = st_.reduction->text;
    if (const Token* use = st_.input_use; use != nullptr) {
      auto sym = symbols_.find(use->text);
      std::string what = sym->second.kind == SymbolKind::kInput
                             ? absl::StrCat("input ", use->text)
                             : absl::StrCat("let ", use->text, " (it depends on an input)");
      Fail(*use, absl::StrCat(what, " cannot be used outside ", combine,
                              "(...): after a reduction only its result, count, parameters "
                              "and constants are available"));
      return;
    }
    reduced_ = st_.reduced;
    combine_ = st_.combine;
  } else if (const Token* use = st_.count_use; use != nullptr) {
    Fail(*use,
         "count is the number of reduced elements: it can only be used around the "
         "reduction of a reduction kernel's output statement (as in sum(x) / count), and "
         "this statement has no reduction");
    return;
  }
  CheckOutputType(name, d_.outputs[index], v);
  if (failed()) return;
  assigned_[index] = &name;
  results_[index] = v.slot;
  if (first_output_ == nullptr) first_output_ = &name;
}

// A value is stored converted to the output's dtype; conversions that lose the kind of value
// (float to integer, number to bool and back) must be written out.
void Checker::CheckOutputType(const Token& name, const OperandDef& output, Value value) {
  const Type t = TypeOf(value);
  const absl::string_view dtype = DTypeName(output.dtype);
  const std::string intro = absl::StrCat("output ", output.name, " is ", dtype,
                                         " but the expression is ", TypeName(t), "; ");
  if (output.dtype == DType::kBool) {
    if (t != Type::kBool) Fail(name, absl::StrCat(intro, "compare it (x != 0) or use bool(...)"));
    return;
  }
  if (t == Type::kBool) {
    absl::string_view cast =
        IsFloating(output.dtype) ? (output.dtype == DType::kF64 ? "f64" : "f32") : "int";
    Fail(name, absl::StrCat(intro, "convert it with ", cast, "(...) or where(...)"));
    return;
  }
  if (!IsFloating(output.dtype) && IsFloat(t)) {
    Fail(name, absl::StrCat(intro, "use int(...) (truncates toward zero)"));
  }
}

bool Checker::Enter(const Token& paren) {
  if (++depth_ > kMaxNesting) {
    Fail(paren, absl::StrCat("expressions nest deeper than ", kMaxNesting,
                             " parentheses and calls; the limit is ", kMaxNesting));
    return false;
  }
  return true;
}

Value Checker::ParseBinary(int level) {
  // C's precedence, loosest first.
  static constexpr absl::string_view kLevels[][4] = {
      {"||"},       {"&&"},     {"|"},          {"^"}, {"&"}, {"==", "!="}, {"<", "<=", ">", ">="},
      {"<<", ">>"}, {"+", "-"}, {"*", "/", "%"}};
  constexpr int kLast = static_cast<int>(std::size(kLevels)) - 1;
  auto operand = [&] { return level == kLast ? ParseUnary() : ParseBinary(level + 1); };
  Value lhs = operand();
  while (!failed()) {
    const Token& op = Peek();
    const auto& ops = kLevels[level];
    if (op.kind != TokenKind::kPunct ||
        std::find(std::begin(ops), std::end(ops), op.text) == std::end(ops)) {
      break;
    }
    Take();
    Value rhs = operand();
    if (failed()) break;
    lhs = Binary(op, lhs, rhs);
  }
  return failed() ? Value{} : lhs;
}

// Prefix operators are collected in a loop, so a long run of them cannot exhaust the stack.
Value Checker::ParseUnary() {
  std::vector<const Token*> ops;
  while (IsPunct(Peek(), "-") || IsPunct(Peek(), "!") || IsPunct(Peek(), "~")) {
    ops.push_back(&Take());
  }
  Value v = ParsePrimary();
  for (auto op = ops.rbegin(); op != ops.rend() && !failed(); ++op) v = Unary(**op, v);
  return failed() ? Value{} : v;
}

Value Checker::ParsePrimary() {
  const Token& t = Peek();
  switch (t.kind) {
    case TokenKind::kInt:
      Take();
      return Constant(Type::kI64, t.int_value, 0, /*weak=*/true, t);
    case TokenKind::kFloat:
      Take();
      return Constant(Type::kF64, 0, t.float_value, /*weak=*/true, t);
    case TokenKind::kName:
      Take();
      return IsPunct(Peek(), "(") ? ParseCall(t) : ParseName(t);
    case TokenKind::kPunct:
      if (t.text == "(") {
        Take();
        if (!Enter(t)) return Value{};
        Value v = ParseExpr();
        if (failed()) return v;
        if (!IsPunct(Peek(), ")")) {
          return Unexpected(Peek(),
                            absl::StrCat("')' to close the '(' at line ", t.line, ":", t.column));
        }
        Take();
        Leave();
        return v;
      }
      break;
    case TokenKind::kEnd:
    case TokenKind::kNewline:
    case TokenKind::kError:
      break;
  }
  return Unexpected(t, "an expression");
}

std::vector<std::string> Checker::VisibleNames() const {
  std::vector<std::string> names;
  for (const auto& [name, symbol] : symbols_) {
    if (symbol.kind != SymbolKind::kOutput) names.push_back(name);
  }
  return names;
}

Value Checker::ParseName(const Token& name) {
  const absl::string_view text = name.text;
  if (text == "true" || text == "false") {
    return Constant(Type::kBool, text == "true", 0, /*weak=*/false, name);
  }
  if (text == "inf" || text == "nan") {
    double v = text == "inf" ? HUGE_VAL : std::nan("");
    return Constant(Type::kF64, 0, v, /*weak=*/true, name);
  }
  if (text == "count") {
    if (st_.in_let) {
      return Fail(name,
                  "count (the number of reduced elements) cannot be used in a let; use it "
                  "in the output statement, around the reduction (sum(x) / count)");
    }
    if (st_.open_reduction != nullptr) {
      return Fail(name, absl::StrCat("count cannot be used inside ", st_.open_reduction->text,
                                     "(...): it is the number of elements reduced, known after "
                                     "the reduction"));
    }
    if (st_.count_use == nullptr) st_.count_use = &name;
    if (count_slot_ < 0) {
      count_slot_ = Add(Node{.kind = NodeKind::kCount, .type = Type::kI64}, name);
    }
    return Value{count_slot_, false};
  }
  auto it = symbols_.find(text);
  if (it == symbols_.end()) {
    if (FindFunction(text) != nullptr) {
      return Fail(name, absl::StrCat(text, " is a function; call it: ", text, "(...)"));
    }
    if (auto later = later_lets_.find(text); later != later_lets_.end()) {
      return Fail(name,
                  absl::StrCat("name ", text, " is used before it is defined (let ", text,
                               " at line ", later->second->line, ":", later->second->column, ")"));
    }
    if (text == "let") return Unexpected(name, "an expression");
    return Fail(name, absl::StrCat("unknown name ", Clip(text),
                                   Suggest(text, VisibleNames(), "the names are")));
  }
  const Symbol& s = it->second;
  const bool outside_reduction = !st_.in_let && st_.open_reduction == nullptr;
  switch (s.kind) {
    case SymbolKind::kInput:
      if (outside_reduction && st_.input_use == nullptr) st_.input_use = &name;
      return InputValue(s.index, name);
    case SymbolKind::kParam:
      return ParamValue(s.index, name);
    case SymbolKind::kLet:
      if (outside_reduction && st_.input_use == nullptr && slots_[s.value.slot].input >= 0) {
        st_.input_use = &name;
      }
      return s.value;
    case SymbolKind::kOutput:
      break;
  }
  return Fail(name, absl::StrCat(text,
                                 " is an output; outputs cannot be read (compute the value in a "
                                 "let and use that)"));
}

Value Checker::ParseCall(const Token& name) {
  const Function* f = FindFunction(name.text);
  if (f == nullptr) {
    if (symbols_.count(name.text) != 0) {
      return Fail(name, absl::StrCat(name.text, " is not a function"));
    }
    if (DTypeFromName(name.text).has_value()) {
      return Fail(name, absl::StrCat("there is no ", name.text,
                                     "(...) cast: values are bool, i64, f32 or f64 (the casts "
                                     "bool, int, i64, f32, f64), and an output of dtype ",
                                     name.text, " converts when it is stored"));
    }
    return Fail(name,
                absl::StrCat("unknown function ", Clip(name.text),
                             Suggest(name.text, internal::FunctionNames(), "the functions are")));
  }
  const bool reduce = f->callee == Callee::kReduce;
  if (reduce) {
    if (st_.in_let) {
      return Fail(name, absl::StrCat(f->name,
                                     "(...) cannot be used in a let: a reduction appears once, "
                                     "in the output statement of a one-output kernel"));
    }
    if (st_.open_reduction != nullptr) {
      return Fail(name, absl::StrCat(f->name, "(...) cannot be nested inside ",
                                     st_.open_reduction->text, "(...)"));
    }
    if (st_.reduction != nullptr) {
      return Fail(name,
                  absl::StrCat("a second reduction, ", f->name,
                               "(...); a reduction kernel has exactly one (", st_.reduction->text,
                               " at line ", st_.reduction->line, ":", st_.reduction->column, ")"));
    }
    if (!st_.may_reduce) {
      return Fail(name, absl::StrCat(f->name,
                                     "(...) makes a reduction kernel, which has exactly one "
                                     "output; this kernel has ",
                                     d_.outputs.size()));
    }
  }
  const Token& open = Take();
  if (!Enter(open)) return Value{};
  if (reduce) st_.open_reduction = &name;
  std::vector<Value> args;
  std::vector<const Token*> starts;
  if (!IsPunct(Peek(), ")")) {
    while (true) {
      starts.push_back(&Peek());
      args.push_back(ParseExpr());
      if (failed()) return Value{};
      if (IsPunct(Peek(), ",")) {
        Take();
        continue;
      }
      if (IsPunct(Peek(), ")")) break;
      return Unexpected(Peek(),
                        static_cast<int>(args.size()) < f->arity
                            ? absl::StrCat("',' after argument ", args.size(), " of ", f->name)
                            : absl::StrCat("')' after the arguments of ", f->name));
    }
  }
  Take();
  Leave();
  if (reduce) st_.open_reduction = nullptr;
  if (static_cast<int>(args.size()) != f->arity) {
    return Fail(
        name, absl::StrCat(f->name, " takes ", f->arity, f->arity == 1 ? " argument" : " arguments",
                           ", found ", args.size()));
  }
  switch (f->callee) {
    case Callee::kMath:
      return Math(*f, name, args);
    case Callee::kWhere:
      return Where(name, args, starts);
    case Callee::kCast:
      return Value{Coerce(args[0], static_cast<Type>(f->op)), false};
    case Callee::kReduce:
      return Reduce(*f, name, args[0]);
  }
  return Value{};
}

// ---- Typed nodes --------------------------------------------------------------------------

int32_t Checker::Add(Node node, int line, int column) {
  node.line = line;
  node.column = column;
  int32_t input = node.kind == NodeKind::kInput ? node.index : -1;
  for (int32_t arg : node.args) {
    if (input < 0) input = slots_[arg].input;
  }
  slots_.push_back(Slot{std::move(node), input});
  return static_cast<int32_t>(slots_.size() - 1);
}

Value Checker::Constant(Type type, int64_t i, double f, bool weak, const Token& at) {
  return Value{Add(Node{.kind = NodeKind::kConst, .type = type, .i = i, .f = f}, at), weak};
}

Value Checker::InputValue(int32_t index, const Token& at) {
  int32_t& slot = input_slots_[index];
  if (slot < 0) {
    slot = Add(
        Node{.kind = NodeKind::kInput, .type = ComputeType(d_.inputs[index].dtype), .index = index},
        at);
  }
  return Value{slot, false};
}

Value Checker::ParamValue(int32_t index, const Token& at) {
  int32_t& slot = param_slots_[index];
  if (slot < 0) {
    Type type = d_.params[index].kind == ScalarKind::kInt ? Type::kI64 : Type::kF64;
    slot = Add(Node{.kind = NodeKind::kParam, .type = type, .index = index}, at);
  }
  return Value{slot, true};
}

// The value converted to `to`: itself, a constant folded to the type (only for the
// conversions to a float type, which are plain roundings), or a kCast node.
int32_t Checker::Coerce(Value v, Type to) {
  const Node from = slots_[v.slot].node;  // a copy: Add() may reallocate
  if (from.type == to) return v.slot;
  auto key = std::make_pair(v.slot, to);
  if (auto it = coerced_.find(key); it != coerced_.end()) return it->second;
  Node node{.type = to};
  if (from.kind == NodeKind::kConst && IsFloat(to)) {
    node.kind = NodeKind::kConst;
    if (IsFloat(from.type)) {
      node.f = to == Type::kF32 ? RoundToF32(from.f) : from.f;
    } else {  // one rounding from the integer (bool: 0 or 1)
      node.f = to == Type::kF32 ? static_cast<double>(static_cast<float>(from.i))
                                : static_cast<double>(from.i);
    }
  } else {
    node.kind = NodeKind::kCast;
    node.args = {v.slot};
  }
  int32_t slot = Add(std::move(node), from.line, from.column);
  coerced_.emplace(key, slot);
  return slot;
}

// The common type of two numeric operands: a weak operand takes the strong one's type (an
// integer i64 becomes f32 when a weak float meets it); otherwise the wider type, in the order
// i64 < f32 < f64.
struct Joined {
  Type type;
  bool weak;
};
Joined Join(Type a, bool weak_a, Type b, bool weak_b) {
  if (weak_a == weak_b) return {std::max(a, b), weak_a};
  const Type strong = weak_a ? b : a;
  const Type weak = weak_a ? a : b;
  if (weak == Type::kI64 || IsFloat(strong)) return {strong, false};
  return {Type::kF32, false};
}

Value Checker::Unary(const Token& op, Value v) {
  const Node& n = slots_[v.slot].node;
  if (op.text == "-") {
    if (n.type == Type::kBool) {
      return Fail(op, "operator - needs a number, found bool; use ! to negate a bool");
    }
    if (n.kind == NodeKind::kConst) {  // -literal is a constant; integers wrap
      int64_t i = static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(n.i));
      return Constant(n.type, i, -n.f, v.weak, op);
    }
    Node node{.kind = NodeKind::kUnary, .type = n.type, .op = U8(UnaryOp::kNeg), .args = {v.slot}};
    return Value{Add(std::move(node), op), v.weak};
  }
  if (op.text == "~") {
    if (n.type != Type::kI64) {
      return Fail(op, absl::StrCat("operator ~ needs an integer, found ", TypeName(n.type),
                                   n.type == Type::kBool ? "; use ! to negate a bool"
                                                         : "; convert with int(...) first"));
    }
    if (n.kind == NodeKind::kConst) return Constant(n.type, ~n.i, 0, v.weak, op);
    Node node{
        .kind = NodeKind::kUnary, .type = n.type, .op = U8(UnaryOp::kBitNot), .args = {v.slot}};
    return Value{Add(std::move(node), op), v.weak};
  }
  if (n.type != Type::kBool) {
    return Fail(op, absl::StrCat("operator ! needs a bool, found ", TypeName(n.type),
                                 "; compare it instead (x == 0)"));
  }
  if (n.kind == NodeKind::kConst) return Constant(Type::kBool, n.i == 0, 0, false, op);
  Node node{
      .kind = NodeKind::kUnary, .type = Type::kBool, .op = U8(UnaryOp::kNot), .args = {v.slot}};
  return Value{Add(std::move(node), op), false};
}

Value Checker::Binary(const Token& op, Value a, Value b) {
  static constexpr std::pair<absl::string_view, BinaryOp> kOps[] = {
      {"+", BinaryOp::kAdd},    {"-", BinaryOp::kSub},    {"*", BinaryOp::kMul},
      {"/", BinaryOp::kDiv},    {"%", BinaryOp::kMod},    {"<", BinaryOp::kLt},
      {"<=", BinaryOp::kLe},    {">", BinaryOp::kGt},     {">=", BinaryOp::kGe},
      {"==", BinaryOp::kEq},    {"!=", BinaryOp::kNe},    {"&&", BinaryOp::kAnd},
      {"||", BinaryOp::kOr},    {"&", BinaryOp::kBitAnd}, {"|", BinaryOp::kBitOr},
      {"^", BinaryOp::kBitXor}, {"<<", BinaryOp::kShl},   {">>", BinaryOp::kShr}};
  BinaryOp kind = BinaryOp::kAdd;
  for (const auto& [text, value] : kOps) {
    if (text == op.text) kind = value;
  }
  const Type ta = TypeOf(a), tb = TypeOf(b);
  const std::string found = absl::StrCat("found ", TypeName(ta), " and ", TypeName(tb));
  const bool logical = kind == BinaryOp::kAnd || kind == BinaryOp::kOr;
  const bool equality = kind == BinaryOp::kEq || kind == BinaryOp::kNe;
  const bool comparison = equality || (kind >= BinaryOp::kLt && kind <= BinaryOp::kGe);
  const bool bools = ta == Type::kBool && tb == Type::kBool;
  const bool numbers = ta != Type::kBool && tb != Type::kBool;
  Node node{.kind = NodeKind::kBinary, .op = U8(kind)};
  if (kind >= BinaryOp::kBitAnd) return BitOperation(op, node, a, b);
  if (logical) {
    if (!bools) {
      return Fail(op, absl::StrCat("operator ", op.text, " needs bools, ", found,
                                   "; compare numbers first (x != 0)"));
    }
    node.type = Type::kBool;
    node.args = {a.slot, b.slot};
    return Value{Add(std::move(node), op), false};
  }
  if (equality && bools) {
    node.type = Type::kBool;
    node.args = {a.slot, b.slot};
    return Value{Add(std::move(node), op), false};
  }
  if (!numbers) {
    return Fail(op, equality ? absl::StrCat("operator ", op.text,
                                            " compares two numbers or two bools, ", found)
                             : absl::StrCat("operator ", op.text, " needs numbers, ", found,
                                            "; convert a bool with int(...) or f32(...), or "
                                            "choose with where(...)"));
  }
  Joined j = Join(ta, a.weak, tb, b.weak);
  int32_t sa = Coerce(a, j.type);
  int32_t sb = Coerce(b, j.type);
  node.args = {sa, sb};
  node.type = comparison ? Type::kBool : j.type;
  return Value{Add(std::move(node), op), comparison ? false : j.weak};
}

// & | ^ << >>: integers only (i64, weak if both are); no conversion from floats or bools.
Value Checker::BitOperation(const Token& op, Node node, Value a, Value b) {
  const Type ta = TypeOf(a), tb = TypeOf(b);
  if (ta != Type::kI64 || tb != Type::kI64) {
    std::string hint = "; convert a float with int(...) (truncates toward zero)";
    if (ta == Type::kBool && tb == Type::kBool) {
      hint = op.text == "&" || op.text == "|" ? absl::StrCat("; for bools use ", op.text, op.text)
                                              : "; for bools use !=";
    } else if (op.text == "<<" || op.text == ">>") {
      hint = ta == Type::kBool || tb == Type::kBool ? "; convert a bool with int(...)" : hint;
    } else if (ta == Type::kBool || tb == Type::kBool) {
      hint = absl::StrCat("; convert a bool with int(...); note that ", op.text,
                          " binds more loosely than comparisons, as in C: write (x ", op.text,
                          " 1) == 0");
    }
    return Fail(op, absl::StrCat("operator ", op.text, " needs integers, found ", TypeName(ta),
                                 " and ", TypeName(tb), hint));
  }
  node.type = Type::kI64;
  node.args = {a.slot, b.slot};
  return Value{Add(std::move(node), op), a.weak && b.weak};
}

Value Checker::Math(const Function& f, const Token& name, const std::vector<Value>& args) {
  const Func func = static_cast<Func>(f.op);
  for (Value a : args) {
    if (TypeOf(a) == Type::kBool) {
      std::vector<std::string> types;
      for (Value b : args) types.emplace_back(TypeName(TypeOf(b)));
      return Fail(name,
                  absl::StrCat(f.name, " needs numbers, found ", absl::StrJoin(types, " and "),
                               "; convert a bool with int(...) or f32(...)"));
    }
  }
  Joined j{TypeOf(args[0]), args[0].weak};
  if (args.size() == 2) j = Join(j.type, j.weak, TypeOf(args[1]), args[1].weak);
  const bool keeps_integers =
      func == Func::kAbs || func == Func::kMaximum || func == Func::kMinimum;
  if (j.type == Type::kI64 && !keeps_integers) j.type = j.weak ? Type::kF64 : Type::kF32;
  // A predicate (isnan, isinf, isfinite) tests its argument as a float and gives a strong bool.
  const bool predicate = IsPredicate(func);
  Node node{.kind = NodeKind::kCall, .type = predicate ? Type::kBool : j.type, .op = f.op};
  for (Value a : args) node.args.push_back(Coerce(a, j.type));
  return Value{Add(std::move(node), name), !predicate && j.weak};
}

Value Checker::Where(const Token& name, const std::vector<Value>& args,
                     const std::vector<const Token*>& starts) {
  if (TypeOf(args[0]) != Type::kBool) {
    return Fail(*starts[0], absl::StrCat("the condition of where must be bool, found ",
                                         TypeName(TypeOf(args[0])), "; compare it (x > 0)"));
  }
  const Type ta = TypeOf(args[1]), tb = TypeOf(args[2]);
  Joined j{Type::kBool, false};
  if (ta != Type::kBool || tb != Type::kBool) {
    if (ta == Type::kBool || tb == Type::kBool) {
      return Fail(name, absl::StrCat("where's branches must both be numbers or both bools, found ",
                                     TypeName(ta), " and ", TypeName(tb)));
    }
    j = Join(ta, args[1].weak, tb, args[2].weak);
  }
  Node node{.kind = NodeKind::kWhere, .type = j.type};
  node.args = {args[0].slot, Coerce(args[1], j.type), Coerce(args[2], j.type)};
  return Value{Add(std::move(node), name), j.weak};
}

Value Checker::Reduce(const Function& f, const Token& name, Value map) {
  const Type t = TypeOf(map);
  if (t == Type::kBool) {
    return Fail(name, absl::StrCat(f.name,
                                   " needs numbers, found bool; use int(...) (sum(int(m)) counts "
                                   "the true elements)"));
  }
  const Combine combine = static_cast<Combine>(f.op);
  const bool index = combine == Combine::kArgmin || combine == Combine::kArgmax;
  Node node{.kind = NodeKind::kReduced, .type = index ? Type::kI64 : t, .args = {map.slot}};
  st_.reduced = Add(std::move(node), name);
  st_.combine = combine;
  st_.reduction = &name;
  return Value{st_.reduced, false};
}

// ---- The program --------------------------------------------------------------------------

// Appends the slots reachable from `roots` to `nodes` in slot order (which is topological),
// with args renumbered; a slot in `given` (slot -> node) is not followed nor appended.
// Returns slot -> node for the slots appended.
std::map<int32_t, int32_t> Append(const std::vector<Slot>& slots, const std::vector<int32_t>& roots,
                                  std::map<int32_t, int32_t> given, std::vector<Node>& nodes) {
  std::vector<char> reached(slots.size(), 0);
  for (int32_t r : roots) reached[r] = 1;
  for (size_t i = slots.size(); i-- > 0;) {
    if (!reached[i] || given.count(static_cast<int32_t>(i)) != 0) continue;
    for (int32_t arg : slots[i].node.args) reached[arg] = 1;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const int32_t slot = static_cast<int32_t>(i);
    if (!reached[i] || given.count(slot) != 0) continue;
    Node node = slots[i].node;
    for (int32_t& arg : node.args) arg = given.at(arg);
    given[slot] = static_cast<int32_t>(nodes.size());
    nodes.push_back(std::move(node));
  }
  return given;
}

// The program's nodes: the slots the results use, in order. For a reduction, the map's
// subgraph, then the kReduced node, then the post-expression's nodes (which compute their
// parameters and constants again rather than share the map's).
Program Emit(const Checked& checked) {
  Program program;
  const std::vector<Slot>& slots = checked.slots;
  if (checked.reduced < 0) {
    std::map<int32_t, int32_t> node_of = Append(slots, checked.results, {}, program.nodes);
    for (int32_t r : checked.results) program.results.push_back(node_of.at(r));
  } else {
    const Slot& reduced = slots[checked.reduced];
    const int32_t map_slot = reduced.node.args[0];
    std::map<int32_t, int32_t> map_nodes = Append(slots, {map_slot}, {}, program.nodes);
    Reduction reduction;
    reduction.combine = checked.combine;
    reduction.map = map_nodes.at(map_slot);
    const bool index =
        reduction.combine == Combine::kArgmin || reduction.combine == Combine::kArgmax;
    reduction.accumulate = index ? Type::kI64 : slots[map_slot].node.type;
    Node node = reduced.node;
    node.args.clear();
    program.nodes.push_back(std::move(node));
    std::map<int32_t, int32_t> post =
        Append(slots, checked.results,
               {{checked.reduced, static_cast<int32_t>(program.nodes.size() - 1)}}, program.nodes);
    program.results.push_back(post.at(checked.results[0]));
    program.reduction = reduction;
  }
  return program;
}

absl::StatusOr<std::string> Sha256Hex(absl::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("SHA-256 is unavailable (OpenSSL EVP_Digest failed)");
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

}  // namespace

absl::StatusOr<Program> Compile(Definition definition) {
  // The cheap limits first: nothing below runs on an oversized body.
  if (definition.body.size() > kMaxBodyBytes) {
    return Invalid("the body is ", definition.body.size(), " bytes; the limit is ", kMaxBodyBytes);
  }
  if (absl::Status s = internal::CheckSignature(definition); !s.ok()) return s;
  absl::StatusOr<Checked> checked = Checker(definition).Run();
  if (!checked.ok()) return checked.status();

  Program program = Emit(*checked);
  if (program.nodes.size() > kMaxNodes) {
    return Invalid("body: the program has ", program.nodes.size(), " nodes; the limit is ",
                   kMaxNodes, " (each operation, cast, constant and operand is a node)");
  }
  absl::StatusOr<std::string> hash = Sha256Hex(FormatDefinition(definition));
  if (!hash.ok()) return hash.status();
  program.hash = *std::move(hash);
  program.definition = std::move(definition);
  return program;
}

}  // namespace tessera::kernels::expr
