#ifndef TESSERA_SERVER_BACKEND_CUDA_NVRTC_H_
#define TESSERA_SERVER_BACKEND_CUDA_NVRTC_H_

// Compiling generated kernels (kernels/expr/cuda_codegen.h) with NVRTC, from the CUDA module,
// without loading NVRTC into the server: each compilation runs tessera-kernel-compiler
// (kernel_compiler_main.cc; protocol in nvrtc_library.h) as a child process, bounded in wall
// time (killed past the deadline, with anything it started), address space (RLIMIT_AS) and
// CPU time (RLIMIT_CPU), with an empty signal mask and no descriptor of the server but its
// pipes. An NVRTC crash, hang or blow-up fails that compilation only.
#include <cstdint>
#include <set>
#include <string>

#include <sys/types.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera::cuda {

/// A program at the node limit (kernels/expr/ast.h) compiles in about 2 s with a peak
/// resident size of about 160 MiB (tests/fake_cuda/cuda_codegen_test.cc); these leave an order of
/// magnitude for a loaded host.
struct KernelCompilerLimits {
  /// Wall-clock time of one compilation ($TESSERA_KERNEL_COMPILE_TIMEOUT, seconds, overrides).
  absl::Duration deadline = absl::Seconds(30);
  /// Address space of the compiler process (RLIMIT_AS).
  uint64_t memory_bytes = 2ull << 30;
  /// CPU seconds of the compiler process (RLIMIT_CPU); it gets SIGXCPU past them.
  int cpu_seconds = 30;
};

/// Runs the kernel compiler helper. Thread-safe: compilations run concurrently, each in its
/// own process; they block the calling thread (never call it on a gRPC thread or under a
/// lock that a job or an RPC takes).
class KernelCompiler {
 public:
  /// $TESSERA_KERNEL_COMPILER, else tessera-kernel-compiler in this executable's directory
  /// (where it is installed, beside tessera-server).
  static std::string DefaultBinary();
  /// The limits with $TESSERA_KERNEL_COMPILE_TIMEOUT applied.
  static KernelCompilerLimits DefaultLimits();

  KernelCompiler(std::string binary, KernelCompilerLimits limits)
      : binary_(std::move(binary)), limits_(limits) {}

  /// "nvrtc 13.0" (the helper's --version), remembered after the first answer.
  /// FAILED_PRECONDITION when the helper cannot run or NVRTC cannot be loaded, naming which.
  absl::StatusOr<std::string> Version() ABSL_LOCKS_EXCLUDED(mu_);

  /// The image of `source` for sm_`arch` (a cubin, or PTX for a GPU newer than NVRTC);
  /// `name` names the kernel in messages. INTERNAL when NVRTC rejects the code (a bug of the
  /// code generator: the log is in the message) or the compiler crashes; FAILED_PRECONDITION
  /// when it cannot run, NVRTC is missing or the architecture is too old for it;
  /// DEADLINE_EXCEEDED past the deadline or the CPU limit; RESOURCE_EXHAUSTED past the
  /// memory limit; UNAVAILABLE after Stop().
  absl::StatusOr<std::string> Compile(const std::string& source, int arch, const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);

  /// Kills running compilations and refuses new ones (the backend is going away).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& binary() const { return binary_; }
  const KernelCompilerLimits& limits() const { return limits_; }

 private:
  struct Output {
    std::string out, err;
    int exit_code = -1;  // when it exited
    int signal = 0;      // when a signal ended it
    bool timed_out = false;
  };
  // Runs the helper with `args` and `input` on its stdin.
  absl::StatusOr<Output> Run(const std::vector<std::string>& args, const std::string& input)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Failure(const Output& o, absl::string_view what) const;

  const std::string binary_;
  const KernelCompilerLimits limits_;
  absl::Mutex mu_;
  std::string version_ ABSL_GUARDED_BY(mu_);
  std::set<pid_t> running_ ABSL_GUARDED_BY(mu_);  // process groups
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_NVRTC_H_
