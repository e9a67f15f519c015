#include "server/backend/select.h"

#include <thread>

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

#include "server/backend/cpu/cpu_backend.h"
#include "server/backend/mps_probe.h"

namespace tessera {
namespace {

// Whether the NVIDIA driver library can be loaded on this host (it is unloaded again).
bool CudaDriverPresent() {
  void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

}  // namespace

absl::StatusOr<BackendChoice> SelectBackend(const BackendOptions& options) {
  if (options.backend != "auto" && options.backend != "cpu" && options.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", options.backend, ": allowed values are auto, cpu, cuda"));
  }
  if (absl::Status mode = CheckMpsMode(options.mps); !mode.ok()) return mode;

  std::string reason;
  if (options.backend == "cpu") {
    reason = "--backend=cpu";
  } else {
    // The CUDA backend module is not part of this release; say precisely why it is not used.
    std::string why = CudaDriverPresent()
                          ? "a CUDA driver is present but this build has no CUDA backend module"
                          : "no CUDA driver (libcuda.so.1) on this host";
    if (options.backend == "cuda") {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend=cuda: ", why, "; use --backend=auto or --backend=cpu"));
    }
    reason = absl::StrCat("--backend=auto: ", why);
  }
  if (options.mps == "require") {
    return absl::FailedPreconditionError(
        absl::StrCat("--mps=require: MPS needs the CUDA backend, but the CPU backend would serve (",
                     reason, "); use --mps=auto or --mps=off"));
  }

  uint64_t memory = options.cpu_memory_bytes;
  if (memory == 0) memory = PhysicalMemoryBytes() / 2;
  if (memory == 0) {
    return absl::FailedPreconditionError(
        "cannot read this host's physical memory; set --cpu_memory_bytes");
  }
  uint32_t threads = options.cpu_threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  BackendChoice choice;
  choice.backend = std::make_unique<CpuBackend>(
      CpuBackend::Options{.memory_bytes = memory, .worker_threads = threads, .reason = reason});
  choice.reason = std::move(reason);
  return choice;
}

}  // namespace tessera
