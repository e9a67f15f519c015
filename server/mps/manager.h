#ifndef TESSERA_SERVER_MPS_MANAGER_H_
#define TESSERA_SERVER_MPS_MANAGER_H_

// --mps_manage: one MPS control daemon per GPU in use, each with its own pipe and log
// directories under a base directory and CUDA_VISIBLE_DEVICES set to its GPU, reference
// counted by the tenants placed on that GPU: started for the first, sent `quit` when the last
// leaves and on shutdown. A daemon that died is noticed and started again while tenants need
// it. Thread-safe.
#include <map>
#include <string>
#include <vector>

#include <sys/types.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "server/mps/control_client.h"

namespace tessera {

class MpsManager {
 public:
  struct Options {
    /// gpu<N>/pipe and gpu<N>/log are made under it.
    std::string base_directory;
    /// nvidia-cuda-mps-control (PATH lookup unless it contains a slash).
    std::string binary = "nvidia-cuda-mps-control";
    /// For each control command, and for a started daemon to write its pid file.
    absl::Duration timeout = absl::Seconds(5);
  };

  /// What the manager knows of one GPU's daemon.
  struct Daemon {
    int gpu = 0;
    std::string pipe_directory;
    std::string log_directory;
    /// Tenants placed on the GPU.
    uint32_t tenants = 0;
    /// 0 when not running.
    pid_t pid = 0;
    /// The last error starting or stopping it (empty when fine).
    std::string error;
  };

  explicit MpsManager(Options options) : options_(std::move(options)) {}
  ~MpsManager() { Shutdown(); }
  MpsManager(const MpsManager&) = delete;
  MpsManager& operator=(const MpsManager&) = delete;

  /// FAILED_PRECONDITION when another user's daemon owns a pipe directory of these GPUs
  /// (this server must run as the MPS user), with a message saying so.
  absl::Status CheckOwnership(const std::vector<int>& gpus) const;

  /// Brings the daemons in line with `tenants_per_gpu` (index: GPU): starts the daemon of
  /// each GPU going from 0 tenants to some, quits it for each going to 0, restarts one that
  /// died while tenants remain. Errors are returned (the first) and kept per daemon.
  absl::Status Reconcile(const std::vector<uint32_t>& tenants_per_gpu) ABSL_LOCKS_EXCLUDED(mu_);

  /// Sends `quit` to every daemon this manager started. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<Daemon> daemons() const ABSL_LOCKS_EXCLUDED(mu_);
  /// A control client for GPU `gpu`'s daemon.
  MpsControlClient ClientFor(int gpu) const;
  std::string PipeDirectory(int gpu) const;

 private:
  absl::Status StartLocked(Daemon& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopLocked(Daemon& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::map<int, Daemon> daemons_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_MPS_MANAGER_H_
