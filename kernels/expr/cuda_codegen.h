#ifndef TESSERA_KERNELS_EXPR_CUDA_CODEGEN_H_
#define TESSERA_KERNELS_EXPR_CUDA_CODEGEN_H_

// The CUDA backend's form of a tenant-defined kernel: CUDA C++ generated from a checked
// program (kernels/expr/ast.h), compiled by NVRTC per device architecture
// (server/backend/cuda/nvrtc.h), and the launch that goes with it. Plain C++ (no CUDA
// headers), so that it is unit-tested on any host.
//
// The source is self-contained (no #include: NVRTC gets no host headers; f16 and bf16 are
// converted with the bit operations of kernels/dtype.cc, so the rounding is the CPU's), and
// a pure function of the program: equal programs give equal text. It has one extern "C"
// entry point, tessera_user_<program hash>, taking one parameter: a struct of 8-byte fields
// (buffer addresses, parameters, geometry) whose layout MakeCudaLaunch fills.
//
//   Element-wise: a grid-stride loop over the broadcast output; each input is read at its
//   element offset from kernels::MakeBroadcast's strides (rank <= 8), every output is
//   computed before any is stored (so an output may alias an input).
//   Reduction: the broadcast shape split into kept and reduced dimensions; each kept element
//   is reduced by one warp (at most kWarpReduceMax elements) or one block (a multiple of 32
//   threads up to 1024), each thread combining a strided share in element order, then a
//   warp-shuffle tree and, for a block, one value per warp through shared memory; argmin and
//   argmax keep the first index. Lane or thread 0 evaluates the post-expression and stores.
//
// Semantics are ast.h's: integer division and remainder by zero give 0, INT64_MIN / -1
// wraps, integer arithmetic wraps (done on unsigned), floats are IEEE (compiled without
// FMA contraction, as the CPU computes them), floats stored to integers truncate and
// saturate with NaN giving 0, f32 and f64 stored to f16/bf16 round to nearest even (f64 once,
// through a round-to-odd f32), and gelu, sigmoid, rsqrt, relu, maximum and minimum are the
// catalog's formulas (kernels/cuda/elementwise.cu).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "kernels/expr/ast.h"
#include "kernels/registry.h"

namespace tessera::kernels::expr {

/// Threads per block of the element-wise kernels and of the warp-per-element reductions.
inline constexpr int kCudaUserBlock = 256;
/// The most threads per block of a block-per-element reduction.
inline constexpr int kCudaUserMaxReduceBlock = 1024;
/// Reductions of at most this many elements per output use one warp per output.
inline constexpr int64_t kWarpReduceMax = 256;

struct CudaKernelSource {
  /// CUDA C++ for NVRTC (and, in tests, for the host: tests/fake_cuda/driver).
  std::string source;
  /// The extern "C" entry point: tessera_user_<program hash>.
  std::string entry;
  bool reduction = false;
};

/// Generates the kernel of `program`. INTERNAL for a program Compile() would not produce
/// (a bad node, operand index, type or hash), naming what is wrong. Thread-safe.
absl::StatusOr<CudaKernelSource> GenerateCudaKernel(const Program& program);

/// One field of the entry point's parameter struct, 8 bytes per element (`tk_i64 name[count]`,
/// or `tk_i64 name` when not an array; addresses `tk_u64`): emitted by GenerateCudaKernel in
/// this order, filled by MakeCudaLaunch. Depends only on the program's kind and operand counts.
struct CudaParamField {
  std::string name;
  int count = 1;
  bool array = false;
};
std::vector<CudaParamField> CudaParamFields(const Program& program);

/// One launch of a generated kernel.
struct CudaLaunch {
  /// The entry point's one parameter, as bytes (pass &params[0] as kernelParams[0]).
  std::vector<int64_t> params;
  /// Zero when there is nothing to compute (an empty output): launch nothing.
  unsigned int grid = 0;
  unsigned int block = 0;
};

/// The launch of `program`'s kernel for a prepared plan of it (input and output metas,
/// attributes: the parameters, and "axes" for a reduction), with the device addresses of the
/// plan's buffers, on a device (or context) of `sms` SMs. INTERNAL for a plan that does not
/// match the program. Thread-safe.
absl::StatusOr<CudaLaunch> MakeCudaLaunch(const Program& program, const Plan& plan,
                                          const std::vector<uint64_t>& inputs,
                                          const std::vector<uint64_t>& outputs, int sms);

}  // namespace tessera::kernels::expr

#endif  // TESSERA_KERNELS_EXPR_CUDA_CODEGEN_H_
