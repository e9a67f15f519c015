#ifndef TESSERA_KERNELS_EXPR_USER_KERNEL_H_
#define TESSERA_KERNELS_EXPR_USER_KERNEL_H_

// A tenant-defined kernel ready to launch: the checked program, its catalog-style signature
// (so launches are validated by the same code as the catalog's: kernels::PrepareKernel), and
// the CPU backend's compiled form. Immutable and shared: a Plan holds a reference, so a kernel
// deleted while a job uses it lives until the job ends.
#include <memory>

#include "absl/status/statusor.h"

#include "kernels/expr/ast.h"
#include "kernels/expr/cpu_program.h"
#include "kernels/registry.h"

namespace tessera::kernels::expr {

struct UserKernel {
  Program program;
  /// Op::kUser. Inputs and outputs with their one dtype; attributes: the parameters (float
  /// or int, with their defaults), and for a reduction "axes" (ints, default all) and
  /// "keepdims" (bool, default false). Inference: inputs broadcast (numpy rules, each input's
  /// rank checked when the definition fixes one) to the elementwise shape, which every output
  /// has; a reduction reduces that shape over `axes`.
  KernelDef def;
  std::unique_ptr<const CpuProgram> cpu;
};

/// Compiles a definition (expr::Compile) and builds the kernel. INVALID_ARGUMENT for a bad
/// definition, including a name the catalog uses.
absl::StatusOr<std::shared_ptr<const UserKernel>> MakeUserKernel(Definition definition);

}  // namespace tessera::kernels::expr

#endif  // TESSERA_KERNELS_EXPR_USER_KERNEL_H_
