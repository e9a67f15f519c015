#ifndef TESSERA_KERNELS_EXPR_NAMES_H_
#define TESSERA_KERNELS_EXPR_NAMES_H_

// Internal to kernels/expr/compile.cc: the language's vocabulary (functions, reserved words,
// the rule for names, type names) and the checks of a definition's signature
// (docs/kernels.md, "Signature" and "Functions"). Not a public API.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "kernels/expr/ast.h"

namespace tessera::kernels::expr::internal {

template <typename E>
constexpr uint8_t U8(E e) {
  return static_cast<uint8_t>(e);
}

enum class Callee : uint8_t { kMath, kCast, kWhere, kReduce };

/// A function of the language.
struct Function {
  absl::string_view name;
  Callee callee;
  int arity;
  uint8_t op;  // Func for kMath, Type for kCast, Combine for kReduce
};

/// The function called `name`, or null.
const Function* FindFunction(absl::string_view name);
/// Every function's name, in the documentation's order.
const std::vector<std::string>& FunctionNames();

/// A function name or a keyword (let, true, false, count, inf, nan, float, and the dtype
/// names): not usable as the name of an operand, a parameter or a let.
bool IsReserved(absl::string_view name);

/// Empty when `name` is a valid name ([a-z_][a-z0-9_]*, at most kMaxNameBytes); else what is
/// wrong, as "the name ... is ...". Does not check IsReserved.
std::string NameProblem(absl::string_view name);

/// "; did you mean y?" naming the closest of `candidates`, else "; NOUN a, b, c, ..." (at
/// most 6), or "" when there are no candidates.
std::string Suggest(absl::string_view name, const std::vector<std::string>& candidates,
                    absl::string_view noun);

absl::string_view TypeName(Type type);
inline bool IsFloat(Type type) { return type == Type::kF32 || type == Type::kF64; }

/// The signature's rules (compile.h): counts within the limits, valid and distinct names,
/// known dtypes, ranks -1..kMaxRank, finite defaults (integers for int parameters).
absl::Status CheckSignature(const Definition& d);

}  // namespace tessera::kernels::expr::internal

#endif  // TESSERA_KERNELS_EXPR_NAMES_H_
