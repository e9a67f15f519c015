#ifndef TESSERA_KERNELS_EXPR_COMPILE_H_
#define TESSERA_KERNELS_EXPR_COMPILE_H_

// From a tenant's definition to a checked program (kernels/expr/ast.h). Pure functions,
// thread-safe; the language and its limits are in docs/kernels.md.
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "kernels/expr/ast.h"

namespace tessera::kernels::expr {

/// Checks the signature (names: [a-z_][a-z0-9_]*, at most kMaxNameBytes, unique across
/// inputs, outputs and parameters, not a function or keyword; counts within kMaxInputs,
/// kMaxOutputs, kMaxParams), parses the body, resolves names, infers and checks types,
/// inserts casts, and builds the program. Every error is INVALID_ARGUMENT; errors in the body
/// start with "body line L:C: " and say what was expected or found; a limit is named with its
/// value ("the body is 20000 bytes; the limit is 16384").
absl::StatusOr<Program> Compile(Definition definition);

/// The text form of a whole definition (what `tessera kernel define --file=k.tk` reads):
///
///   kernel NAME(IN: DTYPE[RANK]?, ...) -> (OUT: DTYPE[RANK]?, ...)
///     params(P: float|int (= DEFAULT)?, ...)?
///   {
///     BODY
///   }
///
/// with `#` comments. INVALID_ARGUMENT with "line L:C: " on a syntax error.
absl::StatusOr<Definition> ParseSource(absl::string_view source);

/// The canonical text of a definition (ParseSource(FormatDefinition(d)) == d); what the hash
/// covers and what ListKernels shows.
std::string FormatDefinition(const Definition& definition);

}  // namespace tessera::kernels::expr

#endif  // TESSERA_KERNELS_EXPR_COMPILE_H_
