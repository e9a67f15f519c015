#ifndef TESSERA_KERNELS_EXPR_CPU_PROGRAM_H_
#define TESSERA_KERNELS_EXPR_CPU_PROGRAM_H_

// The CPU backend's form of a tenant-defined kernel: the program compiled to a compact
// register bytecode, evaluated over cache-sized chunks of elements (numexpr's model), each
// instruction a tight loop over the chunk, so a fused expression makes one pass over memory.
// No generated code is compiled or loaded into the server.
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

#include "kernels/cpu/parallel.h"
#include "kernels/expr/ast.h"
#include "kernels/registry.h"

namespace tessera::kernels::expr {

class CpuProgram {
 public:
  /// Compiles a checked program. INTERNAL only for a program Compile() would not produce.
  static absl::StatusOr<std::unique_ptr<const CpuProgram>> Build(const Program& program);
  virtual ~CpuProgram() = default;

  /// Runs a prepared plan of this program (metas and attributes: the parameters by name, and
  /// for reductions "axes" and "keepdims" as in the catalog's reductions; see ReducedDims).
  /// Buffers are contiguous row-major with the plan's metas; outputs do not overlap inputs.
  /// Work is split with `parallel.For` (the backend's fair scheduler runs the chunks).
  /// Never fails on data (see the semantics in ast.h); INTERNAL for a plan that does not
  /// match the program.
  virtual absl::Status Run(const Plan& plan, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs, Parallel& parallel) const = 0;
};

}  // namespace tessera::kernels::expr

#endif  // TESSERA_KERNELS_EXPR_CPU_PROGRAM_H_
