#ifndef TESSERA_KERNELS_CPU_CPU_KERNELS_H_
#define TESSERA_KERNELS_CPU_CPU_KERNELS_H_

#include <vector>

#include "absl/status/status.h"

#include "kernels/cpu/parallel.h"
#include "kernels/registry.h"

namespace tessera::kernels {

/// Runs a prepared plan on the CPU. Buffers are contiguous row-major with the plan's
/// metas; an output must not overlap an input (callers stage such launches through a
/// temporary). Output buffers hold their prior contents (matmul's beta reads them).
/// INTERNAL only when the plan's op has no CPU implementation (a bug: see CpuImplements).
absl::Status RunCpuKernel(const Plan& plan, const std::vector<const void*>& inputs,
                          const std::vector<void*>& outputs, Parallel& parallel);

/// Whether RunCpuKernel implements `op`: true for every op of the catalog (checked by
/// tests/unit/kernels/implementations_test.cc). Thread-safe.
bool CpuImplements(Op op);

/// Makes the BLAS library single-threaded (the scheduler owns parallelism). Idempotent.
void InitCpuKernels();

}  // namespace tessera::kernels

#endif  // TESSERA_KERNELS_CPU_CPU_KERNELS_H_
