#ifndef TESSERA_SERVER_BACKEND_CUDA_OPS_H_
#define TESSERA_SERVER_BACKEND_CUDA_OPS_H_

// What the CUDA backend runs for each catalog op, as data: the launcher, its operation code
// and the fatbin entry point. Plain C++ without CUDA headers, so that the unit tests check it
// on any host; launch.cc carries it out.
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/registry.h"

namespace tessera::cuda {

/// The launchers of launch.cc, with the entry point each launches (kernels/cuda/*.cu).
enum class CudaLauncher {
  kNone,     // no CUDA implementation: RunStep fails with INTERNAL
  kFill,     // tessera_fill
  kCopy,     // cuMemcpyDtoDAsync, no kernel
  kCast,     // tessera_cast
  kUnary,    // tessera_unary_<dtype>; code: a tessera_cuda::UnaryCode
  kBinary,   // tessera_binary_<dtype>; code: a tessera_cuda::BinaryCode
  kReduce,   // tessera_reduce_<dtype>; code: a tessera_cuda::ReduceCode
  kArgmax,   // tessera_argmax_<dtype>
  kSoftmax,  // tessera_softmax_<dtype>; code: 1 for log-softmax
  kNorm,     // tessera_norm_<dtype>; code: 1 for RMS norm
  kPermute,  // tessera_permute_<element bytes>
  kMatmul,   // cuBLAS (the tenant's handle); an empty product scales y with tessera_unary_<dtype>
  kUser,     // a tenant-defined kernel: its generated entry point (kernels/expr/cuda_codegen.h)
};

/// How the CUDA backend implements one op.
struct CudaImpl {
  CudaLauncher launcher = CudaLauncher::kNone;
  /// The launcher's operation code or variant (see CudaLauncher); 0 where it has none.
  int code = 0;
  /// Whether an output may also be one of the inputs: true where each element is read and
  /// written by the same thread. Otherwise the backend stages such an output through a
  /// temporary.
  bool alias_safe = false;
};

/// The CUDA backend's dispatch: one switch over every op, with no default. Thread-safe.
CudaImpl CudaImplOf(kernels::Op op);

/// Whether the CUDA backend implements `op`: true for every op of the catalog (checked by
/// tests/unit/kernels/implementations_test.cc) and for Op::kUser (generated code,
/// CudaLauncher::kUser). Thread-safe.
bool CudaImplements(kernels::Op op);

/// The entry point that `launcher` launches for operands of `dtype` (the input's, which for
/// the element-wise ops is also the output's); empty where it launches none (kNone, kCopy)
/// or where the kernel is generated per program (kUser).
std::string EntryPointOf(CudaLauncher launcher, kernels::DType dtype);

/// Threads per block of the grid-stride kernels (element-wise, cast, fill, permute).
inline constexpr int kElementwiseBlock = 256;
/// The most threads per block of the one-block-per-row kernels (reduce, argmax, softmax, norm),
/// which take a multiple of 32 up to this, by row length.
inline constexpr int kMaxRowBlock = 1024;
/// Threads per block of the test fault's launch.
inline constexpr int kTestFaultBlock = 1;

/// The most threads per block the module launches `launcher`'s kernels with (0 for those that
/// launch none). tests/unit/kernels/cuda/resources_test.cc checks each kernel's registers and
/// shared memory, as ptxas reports them for sm_80 and sm_90, against these.
int MaxThreadsPerBlock(CudaLauncher launcher);

/// Every entry point the embedded fatbins export (the instantiations in kernels/cuda/*.cu),
/// each resolved when the module loads; includes tessera_test_fault. Thread-safe.
const std::vector<std::string>& FatbinEntryPoints();

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_OPS_H_
