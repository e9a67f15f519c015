#ifndef TESSERA_SERVER_BACKEND_SELECT_H_
#define TESSERA_SERVER_BACKEND_SELECT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

#include "server/backend/backend.h"

namespace tessera {

/// --cuda_completion=auto spins only with this many CPUs or more: the spinning thread may
/// take one core while jobs are in flight, half of a 2-CPU host.
inline constexpr uint32_t kSpinCompletionCpus = 4;

struct BackendOptions {
  /// "auto", "cpu" or "cuda".
  std::string backend = "auto";
  /// "auto", "require" or "off".
  std::string mps = "auto";
  /// CPU backend capacity in bytes; 0: half of the memory this process may use (physical
  /// memory, or the control group's limit when lower).
  uint64_t cpu_memory_bytes = 0;
  /// CPU worker threads; 0: one per CPU this process may use (the affinity mask, or the
  /// control group's CPU quota when lower).
  uint32_t cpu_threads = 0;
  /// Nice value of the CPU backend's workers (0..19; see CpuScheduler).
  int cpu_worker_nice = 0;
  /// CUDA backend: on-disk cache of tenant-defined kernels' compiled images (empty: none).
  std::string kernel_cache_dir;
  /// CUDA backend: "spin" or "host_function" (CudaModuleOptions::completion), or "auto":
  /// spin when this process may use at least kSpinCompletionCpus CPUs, else host_function.
  std::string cuda_completion = "auto";
  /// CUDA backend: programs as CUDA graphs (CudaModuleOptions::graphs).
  bool cuda_graphs = true;
  /// CUDA backend: single launches as CUDA graphs too (CudaModuleOptions::single_launch_graphs).
  bool cuda_single_launch_graphs = false;
};

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  /// Why this backend, for the log and GetServerInfo.
  std::string reason;
};

/// Picks the backend that fits the host and the flags. `cuda` without a usable CUDA
/// backend, or `--mps=require` without MPS, is FAILED_PRECONDITION with the reason; `auto`
/// falls back to the CPU backend and says why. Bad flag values are INVALID_ARGUMENT.
absl::StatusOr<BackendChoice> SelectBackend(const BackendOptions& options);

/// Whether the NVIDIA driver library (libcuda.so.1) can be loaded here. Loads and unloads
/// it without initializing the driver, so the MPS environment can still be set afterwards.
bool CudaDriverPresent();

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_SELECT_H_
