#ifndef TESSERA_SERVER_BACKEND_CUDA_KERNEL_IMAGES_H_
#define TESSERA_SERVER_BACKEND_CUDA_KERNEL_IMAGES_H_

// Compiled images of tenant-defined kernels for the CUDA backend: the generated source of a
// program (kernels/expr/cuda_codegen.h) compiled per GPU architecture by the kernel compiler
// helper (nvrtc.h), on this component's own threads, so that no gRPC thread, job launch or
// completion ever waits for NVRTC.
//
// Images are cached in memory (bounded) and on disk under the cache directory
// (<state_dir>/kernel-cache: directory 0700, files 0600), keyed by the SHA-256 of the source,
// the architecture, the NVRTC version and the driver (CUDA version and kernel module
// version), so that a new toolkit or driver misses the old entries. A file is written
// atomically (a temporary, then rename) with a header naming its key, size and SHA-256, and
// checked on every read: a corrupt or foreign file is recompiled and replaced, never loaded.
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

#include "kernels/expr/ast.h"
#include "kernels/expr/cuda_codegen.h"
#include "server/backend/cuda/nvrtc.h"

namespace tessera::cuda {

/// A program's generated kernel. Immutable.
struct GeneratedKernel {
  kernels::expr::CudaKernelSource kernel;
  /// Hex SHA-256 of kernel.source: what an image is compiled from.
  std::string digest;
  /// The definition's name, for messages.
  std::string name;
};

/// A compiled image (cubin, or PTX for a GPU newer than NVRTC), for cuModuleLoadData.
using KernelImage = std::shared_ptr<const std::string>;

struct KernelImagesOptions {
  /// Where images are kept across restarts; empty: memory only.
  std::string cache_dir;
  /// The driver, as it goes into cache keys ("cuda 13000, nvidia 580.82.07").
  std::string driver;
  /// The compiler helper and its limits (KernelCompiler::DefaultBinary, DefaultLimits).
  std::string compiler;
  KernelCompilerLimits limits;
  /// Compilations at a time (each is one single-threaded process).
  int workers = 2;
};

/// Thread-safe. Callbacks run on the component's threads with none of its locks held; they
/// may call Find and Fetch again.
class KernelImages {
 public:
  using Callback = absl::AnyInvocable<void(absl::StatusOr<KernelImage>) &&>;

  /// Starts the compile threads. A cache directory that cannot be made owner-only is logged
  /// and left unused (images are then kept in memory only).
  explicit KernelImages(KernelImagesOptions options);
  /// Stops running compilations, answers every waiting Fetch with UNAVAILABLE and joins the
  /// threads.
  ~KernelImages();

  /// The generated kernel of `program`, remembered by program hash. INTERNAL for a program
  /// the code generator refuses.
  absl::StatusOr<std::shared_ptr<const GeneratedKernel>> Generate(
      const kernels::expr::Program& program) ABSL_LOCKS_EXCLUDED(mu_);

  /// The image of `kernel` for sm_`arch` if it is in memory now, else null. Never blocks.
  KernelImage Find(const GeneratedKernel& kernel, int arch) ABSL_LOCKS_EXCLUDED(mu_);

  /// Produces the image of `kernel` for sm_`arch` (from memory, the disk cache or the
  /// compiler) and calls `done` with it, later, on a compile thread (never inside Fetch).
  /// Requests for one key share one compilation; `tenant`'s requests take turns with other
  /// tenants', and one tenant occupies at most all threads but one, so that one tenant's many
  /// or slow compilations delay only its own. The errors are KernelCompiler::Compile's.
  void Fetch(std::shared_ptr<const GeneratedKernel> kernel, int arch, const std::string& tenant,
             Callback done) ABSL_LOCKS_EXCLUDED(mu_);

  /// The cache file of `kernel` for sm_`arch` once the compiler's version is known ("" before,
  /// or without a cache directory). For tests.
  std::string CacheFile(const GeneratedKernel& kernel, int arch) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Request {
    std::string key;
    std::shared_ptr<const GeneratedKernel> kernel;
    int arch = 0;
  };
  struct Cached {
    KernelImage image;
    std::list<std::string>::iterator lru;
  };

  static std::string KeyOf(const GeneratedKernel& kernel, int arch);
  void Work() ABSL_LOCKS_EXCLUDED(mu_);
  // The next request of the first tenant in turn that may start one more compilation.
  bool NextLocked(Request& request, std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<KernelImage> Produce(const Request& request) ABSL_LOCKS_EXCLUDED(mu_);
  // The disk key and file of a request, given the compiler's version.
  std::string DiskKey(const Request& request, const std::string& version) const;
  std::string DiskFile(const Request& request, const std::string& version) const;
  KernelImage ReadFile(const std::string& path, const std::string& key) const;
  void WriteFile(const std::string& path, const std::string& key, const std::string& image) const;
  void RememberLocked(const std::string& key, KernelImage image) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KernelImagesOptions options_;
  bool disk_ = false;  // the cache directory is usable (fixed at construction)
  KernelCompiler compiler_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<const GeneratedKernel>> generated_ ABSL_GUARDED_BY(mu_);
  // Images in memory, least recently used first.
  std::map<std::string, Cached> images_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  uint64_t image_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Code NVRTC rejected (a generator bug): not compiled again.
  std::map<std::string, absl::Status> rejected_ ABSL_GUARDED_BY(mu_);
  // Keys queued or compiling, with everyone waiting for them.
  std::map<std::string, std::vector<Callback>> flights_ ABSL_GUARDED_BY(mu_);
  // Queued requests per tenant, and the tenants with some, in turn.
  std::map<std::string, std::deque<Request>> queues_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> turns_ ABSL_GUARDED_BY(mu_);
  // Requests being produced, per tenant; at most per_tenant_ each.
  std::map<std::string, int> running_ ABSL_GUARDED_BY(mu_);
  int per_tenant_ = 1;
  std::vector<std::thread> workers_;
};

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_KERNEL_IMAGES_H_
