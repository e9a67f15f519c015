#ifndef TESSERA_SERVER_BACKEND_CUDA_MODULE_H_
#define TESSERA_SERVER_BACKEND_CUDA_MODULE_H_

// The contract between tessera-server and the CUDA backend module (libtessera_cuda.so),
// which the server dlopens at run time so that the server binary itself never links the
// CUDA driver, runtime or cuBLAS. Both sides are built together from this tree.
#include <memory>
#include <string>

#include "absl/status/statusor.h"

#include "server/backend/backend.h"

namespace tessera {

struct CudaModuleOptions {
  /// "auto", "require" or "off" (already checked).
  std::string mps = "auto";
  /// Where compiled images of tenant-defined kernels are cached on disk (owner-only);
  /// empty: memory only. <state_dir>/kernel-cache in the server.
  std::string kernel_cache_dir;
  /// How the completion thread learns that jobs ended (already checked): "spin" (it polls
  /// the in-flight jobs' events, spinning briefly and then backing off, and sleeps while
  /// none is in flight) or "host_function" (each job ends with a host function that wakes
  /// it). docs/operations.md, "Job completion".
  std::string completion = "spin";
  /// Whether programs (jobs of several steps) run as CUDA graphs from their second run on
  /// (CudaContext::LaunchProgramLocked).
  bool graphs = true;
  /// Whether a job of one step (a Launch) runs as a CUDA graph too, from its second run on
  /// (needs `graphs`). Off by default: one kernel launch is one driver call either way;
  /// tests/gpu/gpu_bench.cc measures both on a GPU.
  bool single_launch_graphs = false;
};

/// The module's one exported symbol, looked up by this name.
inline constexpr char kCudaModuleEntry[] = "tessera_cuda_backend_create";
/// Creates the CUDA backend; FAILED_PRECONDITION says why the host cannot run it (no
/// driver, no device, a driver too old, --mps=require without MPS).
using CudaModuleEntry = void (*)(const CudaModuleOptions& options,
                                 absl::StatusOr<std::unique_ptr<Backend>>* result);

/// Test-only hook exported by the module as "tessera_cuda_inject_fault": launches a kernel
/// that makes an illegal memory access on `stream` of `context` (a context of this module).
inline constexpr char kCudaModuleInjectFault[] = "tessera_cuda_inject_fault";
using CudaInjectFault = absl::Status (*)(TenantContext& context, int stream);

/// Benchmark hook exported by the module as "tessera_cuda_context_handle": the CUcontext that
/// `context` (a context of this module) runs its jobs in now, or null, so that a baseline can
/// run in the very context a tenant's jobs run in (tests/gpu/gpu_bench.cc).
inline constexpr char kCudaModuleContextHandle[] = "tessera_cuda_context_handle";
using CudaContextHandle = void* (*)(TenantContext& context);

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_CUDA_MODULE_H_
