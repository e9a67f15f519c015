#ifndef TESSERA_TESTS_FUZZ_KERNEL_CHECKS_H_
#define TESSERA_TESTS_FUZZ_KERNEL_CHECKS_H_

// What the kernel-language targets (kernel_source_fuzz, define_kernel_fuzz) check of a
// tenant's definition, from compiling it to running it.
#include <cstdint>
#include <vector>

#include "kernels/expr/ast.h"
#include "kernels/registry.h"
#include "kernels/shape.h"

namespace tessera::fuzz {

/// Compiles `definition` as DefineKernel does (kernels::expr::MakeUserKernel) and checks:
///  - a refusal is INVALID_ARGUMENT (never INTERNAL: that is a program the checker accepted
///    and a backend could not build);
///  - an accepted kernel's canonical text (FormatDefinition, what the store keeps and a
///    restart compiles again) parses back to the same definition and the same program hash;
///  - the CUDA code generator accepts the program (GenerateCudaKernel, plain C++ here);
///  - a launch with `input_shapes` (one per input; missing ones are [2, 3]) and `attrs`
///    that PrepareKernel accepts has valid outputs, gets a CUDA launch (MakeCudaLaunch) and
///    runs on the CPU program without error.
/// Returns whether the definition compiled.
bool CheckDefinition(kernels::expr::Definition definition,
                     const std::vector<kernels::Shape>& input_shapes, kernels::Attrs attrs,
                     uint64_t seed);

}  // namespace tessera::fuzz

#endif  // TESSERA_TESTS_FUZZ_KERNEL_CHECKS_H_
