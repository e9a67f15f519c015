#ifndef TESSERA_SERVER_BACKEND_CUDA_LAUNCH_H_
#define TESSERA_SERVER_BACKEND_CUDA_LAUNCH_H_

// From a validated plan to work on a stream: the catalog's kernels from the embedded fatbins,
// matmul through cuBLAS, as ops.h maps each op.
#include <map>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda.h>

#include "absl/status/statusor.h"

#include "kernels/registry.h"
#include "server/backend/cuda/driver.h"

namespace tessera::cuda {

class BlasHandle;

/// The kernel libraries embedded in this module, loaded once per process with
/// context-independent loading (cuLibraryLoadData); each kernel resolves in whichever
/// context is current at launch. Immutable after Load; thread-safe.
class KernelTable {
 public:
  static absl::StatusOr<std::unique_ptr<KernelTable>> Load(const Driver& driver);
  ~KernelTable();

  /// NOT_FOUND naming the kernel (a build without it is a bug).
  absl::StatusOr<CUkernel> Find(const std::string& name) const;
  /// Loads every kernel into the current context (cuKernelGetFunction). The driver loads a
  /// library's kernels lazily, at a context's first launch of each, and that load may wait
  /// for the context's queued work (NVIDIA's lazy-loading notes; seen on an H100: a tenant's
  /// first element-wise launch behind its 2 s program blocked for 1.9 s, holding the
  /// context's lock and the caller's thread). Done once per context, while it is idle.
  absl::Status LoadIntoCurrentContext() const;
  size_t size() const { return kernels_.size(); }

 private:
  explicit KernelTable(const Driver& driver) : driver_(driver) {}
  const Driver& driver_;
  std::vector<CUlibrary> libraries_;
  std::map<std::string, CUkernel, std::less<>> kernels_;
};

/// Where a step runs: all of it belongs to one tenant context, current on the calling thread.
struct LaunchTarget {
  const Driver* driver = nullptr;
  const KernelTable* kernels = nullptr;
  CUstream stream = nullptr;
  /// The tenant's cuBLAS handle with its workspaces (bound to `stream` here), for matmul.
  BlasHandle* blas = nullptr;
  /// SMs the context may use, for grid sizing.
  int sms = 1;
  /// For a tenant-defined kernel (Op::kUser): its entry point, loaded in the context.
  CUfunction user = nullptr;
};

/// Whether a kernel may write an output that is also one of its inputs (element-wise
/// kernels, tenant-defined ones included, read and write each element in the same thread);
/// others are staged.
bool AliasSafe(const kernels::Plan& plan);

/// Whether the plan's op runs on cuBLAS, so that its context needs the tenant's handle (and
/// its workspace) before RunStep.
bool UsesCublas(const kernels::Plan& plan);

/// Enqueues `plan` on the target's stream. Buffers are device pointers with the plan's metas,
/// inputs then outputs; no output overlaps an input unless AliasSafe. Errors are the
/// launch's (asynchronous faults surface later on the stream).
///
/// Threads and locks: called by CudaContext::LaunchStep with the context's `mu_` held and
/// its context current, on the thread that enqueues the job (no other lock of the core or
/// the backend is held). It takes no lock itself, but it may block: the driver or cuBLAS can
/// wait for the device (a queue full of launches, a kernel or cuBLAS module loaded at first
/// use), and the context's `mu_` stays held meanwhile.
absl::Status RunStep(const LaunchTarget& target, const kernels::Plan& plan,
                     const std::vector<CUdeviceptr>& inputs,
                     const std::vector<CUdeviceptr>& outputs);

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_LAUNCH_H_
