// The language's vocabulary and the signature rules (names.h).
#include "kernels/expr/names.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "kernels/expr/lexer.h"
#include "kernels/shape.h"

namespace tessera::kernels::expr::internal {
namespace {

constexpr Function kFunctions[] = {
    {"abs", Callee::kMath, 1, U8(Func::kAbs)},
    {"exp", Callee::kMath, 1, U8(Func::kExp)},
    {"log", Callee::kMath, 1, U8(Func::kLog)},
    {"sqrt", Callee::kMath, 1, U8(Func::kSqrt)},
    {"rsqrt", Callee::kMath, 1, U8(Func::kRsqrt)},
    {"relu", Callee::kMath, 1, U8(Func::kRelu)},
    {"gelu", Callee::kMath, 1, U8(Func::kGelu)},
    {"sigmoid", Callee::kMath, 1, U8(Func::kSigmoid)},
    {"tanh", Callee::kMath, 1, U8(Func::kTanh)},
    {"pow", Callee::kMath, 2, U8(Func::kPow)},
    {"maximum", Callee::kMath, 2, U8(Func::kMaximum)},
    {"minimum", Callee::kMath, 2, U8(Func::kMinimum)},
    {"sin", Callee::kMath, 1, U8(Func::kSin)},
    {"cos", Callee::kMath, 1, U8(Func::kCos)},
    {"tan", Callee::kMath, 1, U8(Func::kTan)},
    {"arcsin", Callee::kMath, 1, U8(Func::kArcsin)},
    {"arccos", Callee::kMath, 1, U8(Func::kArccos)},
    {"arctan", Callee::kMath, 1, U8(Func::kArctan)},
    {"arctan2", Callee::kMath, 2, U8(Func::kArctan2)},
    {"sinh", Callee::kMath, 1, U8(Func::kSinh)},
    {"cosh", Callee::kMath, 1, U8(Func::kCosh)},
    {"arcsinh", Callee::kMath, 1, U8(Func::kArcsinh)},
    {"arccosh", Callee::kMath, 1, U8(Func::kArccosh)},
    {"arctanh", Callee::kMath, 1, U8(Func::kArctanh)},
    {"log10", Callee::kMath, 1, U8(Func::kLog10)},
    {"log2", Callee::kMath, 1, U8(Func::kLog2)},
    {"log1p", Callee::kMath, 1, U8(Func::kLog1p)},
    {"exp2", Callee::kMath, 1, U8(Func::kExp2)},
    {"expm1", Callee::kMath, 1, U8(Func::kExpm1)},
    {"cbrt", Callee::kMath, 1, U8(Func::kCbrt)},
    {"hypot", Callee::kMath, 2, U8(Func::kHypot)},
    {"ceil", Callee::kMath, 1, U8(Func::kCeil)},
    {"floor", Callee::kMath, 1, U8(Func::kFloor)},
    {"trunc", Callee::kMath, 1, U8(Func::kTrunc)},
    {"round", Callee::kMath, 1, U8(Func::kRound)},
    {"copysign", Callee::kMath, 2, U8(Func::kCopysign)},
    {"isnan", Callee::kMath, 1, U8(Func::kIsnan)},
    {"isinf", Callee::kMath, 1, U8(Func::kIsinf)},
    {"isfinite", Callee::kMath, 1, U8(Func::kIsfinite)},
    {"where", Callee::kWhere, 3, 0},
    {"bool", Callee::kCast, 1, U8(Type::kBool)},
    {"int", Callee::kCast, 1, U8(Type::kI64)},
    {"i64", Callee::kCast, 1, U8(Type::kI64)},
    {"f32", Callee::kCast, 1, U8(Type::kF32)},
    {"f64", Callee::kCast, 1, U8(Type::kF64)},
    {"sum", Callee::kReduce, 1, U8(Combine::kSum)},
    {"prod", Callee::kReduce, 1, U8(Combine::kProd)},
    {"min", Callee::kReduce, 1, U8(Combine::kMin)},
    {"max", Callee::kReduce, 1, U8(Combine::kMax)},
    {"argmin", Callee::kReduce, 1, U8(Combine::kArgmin)},
    {"argmax", Callee::kReduce, 1, U8(Combine::kArgmax)},
};

// Reserved besides the function names: keywords, constants, and type names kept for casts
// the language may add.
constexpr absl::string_view kKeywords[] = {"let",   "true", "false", "count", "inf", "nan",
                                           "float", "i32",  "u8",    "f16",   "bf16"};

// Edit distance, for "did you mean"; only computed for names of similar length.
size_t Distance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t next = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = row[j];
      row[j] = next;
    }
  }
  return row[b.size()];
}

absl::Status Invalid(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

std::string OperandLabel(absl::string_view kind, size_t i, absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return absl::StrCat(kind, "s[", i, "]");
  return absl::StrCat(kind, " ", Clip(name));
}

absl::Status CheckOperands(absl::string_view kind, const std::vector<OperandDef>& operands) {
  for (size_t i = 0; i < operands.size(); ++i) {
    const OperandDef& o = operands[i];
    std::string label = OperandLabel(kind, i, o.name);
    if (std::string problem = NameProblem(o.name); !problem.empty()) {
      return Invalid(label, ": ", problem);
    }
    if (IsReserved(o.name)) {
      return Invalid(label, ": ", o.name,
                     " is reserved (a function or keyword of the language); choose another name");
    }
    if (!DTypeFromInt(static_cast<int>(o.dtype)).has_value()) {
      return Invalid(label, ": dtype ", static_cast<int>(o.dtype),
                     " is not one of f32, f16, bf16, f64, i32, i64, u8, bool");
    }
    if (o.rank < -1 || o.rank > static_cast<int>(kMaxRank)) {
      return Invalid(label, ": rank ", o.rank, " is out of range; a rank is 0 to ", kMaxRank,
                     ", or -1 for any rank");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckParams(const std::vector<ScalarDef>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const ScalarDef& p = params[i];
    std::string label = OperandLabel("parameter", i, p.name);
    if (std::string problem = NameProblem(p.name); !problem.empty()) {
      return Invalid(label, ": ", problem);
    }
    if (IsReserved(p.name)) {
      return Invalid(label, ": ", p.name,
                     " is reserved (a function or keyword of the language); choose another name");
    }
    if (p.kind != ScalarKind::kFloat && p.kind != ScalarKind::kInt) {
      return Invalid(label, ": kind ", static_cast<int>(p.kind), " is not float or int");
    }
    if (!p.default_value.has_value()) continue;
    const double v = *p.default_value;
    if (!std::isfinite(v)) return Invalid(label, ": the default ", v, " is not finite");
    // Int parameters travel as doubles here: only integers a double holds exactly.
    constexpr double kMaxExactInt = 9007199254740992.0;  // 2^53
    if (p.kind == ScalarKind::kInt && (v != std::trunc(v) || std::fabs(v) > kMaxExactInt)) {
      return Invalid(label, ": the default ", v,
                     " of an int parameter must be an integer of magnitude at most 2^53");
    }
  }
  return absl::OkStatus();
}

}  // namespace

const Function* FindFunction(absl::string_view name) {
  for (const Function& f : kFunctions) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool IsReserved(absl::string_view name) {
  return FindFunction(name) != nullptr ||
         std::find(std::begin(kKeywords), std::end(kKeywords), name) != std::end(kKeywords);
}

// Empty when `name` is a valid name ([a-z_][a-z0-9_]*, at most kMaxNameBytes); else why not.
std::string NameProblem(absl::string_view name) {
  if (name.empty()) return "the name is empty";
  if (name.size() > kMaxNameBytes) {
    return absl::StrCat("the name ", Clip(name), " is ", name.size(), " bytes; the limit is ",
                        kMaxNameBytes);
  }
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) {
      return absl::StrCat("the name ", Clip(name),
                          " is invalid: names are lowercase letters, digits and '_', not "
                          "starting with a digit ([a-z_][a-z0-9_]*)");
    }
  }
  return "";
}

absl::string_view TypeName(Type type) {
  switch (type) {
    case Type::kBool:
      return "bool";
    case Type::kI64:
      return "i64";
    case Type::kF32:
      return "f32";
    case Type::kF64:
      return "f64";
  }
  return "?";
}

const std::vector<std::string>& FunctionNames() {
  static const std::vector<std::string>* const names = [] {
    auto* v = new std::vector<std::string>;
    for (const Function& f : kFunctions) v->emplace_back(f.name);
    return v;
  }();
  return *names;
}

std::string Suggest(absl::string_view name, const std::vector<std::string>& candidates,
                    absl::string_view noun) {
  std::vector<std::pair<size_t, std::string>> close;
  // Short names are close only to a name one edit away.
  const size_t allowed = name.size() <= 3 ? 1 : std::max<size_t>(2, name.size() / 3);
  for (const std::string& c : candidates) {
    size_t gap = c.size() > name.size() ? c.size() - name.size() : name.size() - c.size();
    if (gap > allowed) continue;
    size_t d = Distance(name, c);
    if (d <= allowed) close.emplace_back(d, c);
  }
  std::sort(close.begin(), close.end());
  if (!close.empty()) {
    std::vector<std::string> names;  // the closest ones (at most 3)
    for (size_t i = 0; i < close.size() && i < 3 && close[i].first == close[0].first; ++i) {
      names.push_back(close[i].second);
    }
    return absl::StrCat("; did you mean ", absl::StrJoin(names, " or "), "?");
  }
  if (candidates.empty()) return "";
  constexpr size_t kListed = 6;
  std::vector<std::string> listed(candidates.begin(),
                                  candidates.begin() + std::min(candidates.size(), kListed));
  return absl::StrCat(
      "; ", noun, " ", absl::StrJoin(listed, ", "),
      candidates.size() > kListed ? absl::StrCat(", ... (", candidates.size(), " in all)") : "");
}

absl::Status CheckSignature(const Definition& d) {
  if (d.inputs.size() > kMaxInputs) {
    return Invalid("the kernel has ", d.inputs.size(), " inputs; the limit is ", kMaxInputs);
  }
  if (d.outputs.size() > kMaxOutputs) {
    return Invalid("the kernel has ", d.outputs.size(), " outputs; the limit is ", kMaxOutputs);
  }
  if (d.outputs.empty()) return Invalid("the kernel has no outputs; it needs at least one");
  if (d.params.size() > kMaxParams) {
    return Invalid("the kernel has ", d.params.size(), " parameters; the limit is ", kMaxParams);
  }
  if (std::string problem = NameProblem(d.name); !problem.empty()) {
    return Invalid("kernel name: ", problem);
  }
  if (absl::Status s = CheckOperands("input", d.inputs); !s.ok()) return s;
  if (absl::Status s = CheckOperands("output", d.outputs); !s.ok()) return s;
  if (absl::Status s = CheckParams(d.params); !s.ok()) return s;
  std::map<std::string, std::string, std::less<>> seen;  // name -> what it names
  auto unique = [&](absl::string_view kind, const std::string& name) -> absl::Status {
    auto [it, inserted] = seen.emplace(name, std::string(kind));
    if (inserted) return absl::OkStatus();
    return Invalid("the name ", name, " is used twice (", it->second, " ", name, " and ", kind, " ",
                   name, "); inputs, outputs and parameters need distinct names");
  };
  for (const OperandDef& o : d.inputs) {
    if (absl::Status s = unique("input", o.name); !s.ok()) return s;
  }
  for (const OperandDef& o : d.outputs) {
    if (absl::Status s = unique("output", o.name); !s.ok()) return s;
  }
  for (const ScalarDef& p : d.params) {
    if (absl::Status s = unique("parameter", p.name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels::expr::internal
