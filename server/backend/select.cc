#include "server/backend/select.h"

#include <climits>
#include <cstdlib>

#include <dlfcn.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "server/backend/cpu/cpu_backend.h"
#include "server/backend/cuda_module.h"
#include "server/backend/mps_probe.h"
#include "server/common/host_limits.h"

namespace tessera {
namespace {

// The directory holding this executable, with a trailing slash ("" when unknown).
std::string ExecutableDirectory() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  std::string dir(path, static_cast<size_t>(n));
  return dir.substr(0, dir.rfind('/') + 1);
}

// Loads the CUDA backend module ($TESSERA_CUDA_MODULE, else next to the binary: the
// installed layout, then the build tree) and creates the backend. The module stays loaded
// for the life of the process.
absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend(const BackendOptions& options) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("TESSERA_CUDA_MODULE"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else if (TESSERA_CUDA_MODULE_ENABLED) {
    const std::string dir = ExecutableDirectory();
    candidates = {dir + TESSERA_CUDA_MODULE_INSTALLED, dir + TESSERA_CUDA_MODULE_BUILT};
  } else {
    return absl::FailedPreconditionError(
        "a CUDA driver is present but this build has no CUDA backend module (built without "
        "the CUDA toolkit or with TESSERA_CUDA=OFF)");
  }
  std::string errors;
  for (const std::string& path : candidates) {
    if (access(path.c_str(), F_OK) != 0) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", path, ": not found");
      continue;
    }
    void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (module == nullptr) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", "cannot load ", path, ": ", dlerror());
      continue;
    }
    auto entry = reinterpret_cast<CudaModuleEntry>(dlsym(module, kCudaModuleEntry));
    if (entry == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is not a Tessera CUDA module (no ", kCudaModuleEntry, ")"));
    }
    absl::StatusOr<std::unique_ptr<Backend>> backend;
    std::string completion = options.cuda_completion;
    if (completion == "auto") {
      const HostLimits host = ReadHostLimits();
      completion = host.cpus >= kSpinCompletionCpus ? "spin" : "host_function";
      spdlog::info("--cuda_completion=auto: {} ({})", completion, host.cpus_source);
    }
    entry(CudaModuleOptions{.mps = options.mps,
                            .kernel_cache_dir = options.kernel_cache_dir,
                            .completion = completion,
                            .graphs = options.cuda_graphs,
                            .single_launch_graphs = options.cuda_single_launch_graphs},
          &backend);
    return backend;
  }
  return absl::FailedPreconditionError(absl::StrCat("the CUDA backend module could not be loaded (",
                                                    errors,
                                                    "); set TESSERA_CUDA_MODULE to its path"));
}

}  // namespace

bool CudaDriverPresent() {
  void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

absl::StatusOr<BackendChoice> SelectBackend(const BackendOptions& options) {
  if (options.backend != "auto" && options.backend != "cpu" && options.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", options.backend, ": allowed values are auto, cpu, cuda"));
  }
  if (absl::Status mode = CheckMpsMode(options.mps); !mode.ok()) return mode;
  if (options.cuda_completion != "auto" && options.cuda_completion != "spin" &&
      options.cuda_completion != "host_function") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_completion=", options.cuda_completion,
                     ": allowed values are auto, spin, host_function"));
  }

  std::string reason;
  if (options.backend == "cpu") {
    reason = "--backend=cpu";
  } else if (!CudaDriverPresent()) {
    std::string why = "no CUDA driver (libcuda.so.1) on this host";
    if (options.backend == "cuda") {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend=cuda: ", why, "; use --backend=auto or --backend=cpu"));
    }
    reason = absl::StrCat("--backend=auto: ", why);
  } else {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = LoadCudaBackend(options);
    if (cuda.ok()) {
      BackendChoice choice;
      choice.backend = *std::move(cuda);
      choice.reason = absl::StrCat("--backend=", options.backend, ": CUDA driver and ",
                                   choice.backend->devices().size(), " GPU(s) found");
      return choice;
    }
    // --mps=require failing inside the module is the operator's answer, not a reason to
    // serve on the CPU.
    if (options.backend == "cuda" || options.mps == "require") {
      return absl::Status(cuda.status().code(), absl::StrCat("--backend=", options.backend, ": ",
                                                             cuda.status().message()));
    }
    reason = absl::StrCat("--backend=auto: the CUDA backend cannot run here (",
                          cuda.status().message(), ")");
  }
  if (options.mps == "require") {
    return absl::FailedPreconditionError(
        absl::StrCat("--mps=require: MPS needs the CUDA backend, but the CPU backend would serve (",
                     reason, "); use --mps=auto or --mps=off"));
  }

  // Defaults from what this process may use (a container's cgroup limits), not the host's
  // totals: a pool of 64 workers under a 4-CPU quota is throttled, and half of a 512 GiB
  // node's memory under a 16 GiB limit is an OOM kill.
  const HostLimits host = ReadHostLimits();
  uint64_t memory = options.cpu_memory_bytes;
  if (memory == 0) memory = host.memory_bytes / 2;
  if (memory == 0) {
    return absl::FailedPreconditionError(
        "cannot read this host's physical memory; set --cpu_memory_bytes");
  }
  uint32_t threads = options.cpu_threads;
  if (threads == 0) threads = host.cpus;
  spdlog::info("CPU backend: {} worker thread(s) ({}), {} bytes of tensor memory ({})", threads,
               options.cpu_threads != 0 ? "--cpu_threads" : host.cpus_source, memory,
               options.cpu_memory_bytes != 0 ? "--cpu_memory_bytes"
                                             : absl::StrCat("half of ", host.memory_source));
  BackendChoice choice;
  choice.backend =
      std::make_unique<CpuBackend>(CpuBackend::Options{.memory_bytes = memory,
                                                       .worker_threads = threads,
                                                       .worker_nice = options.cpu_worker_nice,
                                                       .reason = reason});
  choice.reason = std::move(reason);
  return choice;
}

}  // namespace tessera
