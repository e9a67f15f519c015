#ifndef TESSERA_SERVER_MPS_OPS_H_
#define TESSERA_SERVER_MPS_OPS_H_

// What the admin API sees of MPS: the daemons (managed per GPU with --mps_manage, or the one
// found through CUDA_MPS_PIPE_DIRECTORY) and what each says about its servers and clients.
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

#include "server/mps/control_client.h"
#include "server/mps/manager.h"

namespace tessera {

struct MpsOpsOptions {
  /// --mps_manage: run one control daemon per GPU with tenants.
  bool manage = false;
  /// --mps_base_dir: gpu<N>/{pipe,log} of the managed daemons.
  std::string base_directory;
  /// --mps_control: the control executable.
  std::string binary = "nvidia-cuda-mps-control";
  absl::Duration timeout = absl::Seconds(5);
};

struct MpsServerReport {
  pid_t pid = 0;
  MpsServerState state = MpsServerState::kUnknown;
  std::vector<pid_t> clients;
};

struct MpsDaemonReport {
  int gpu = -1;
  std::string pipe_directory;
  pid_t pid = 0;
  bool managed = false;
  uint32_t tenants = 0;
  std::vector<MpsServerReport> servers;
  double default_active_thread_percentage = 0;
  std::string default_pinned_mem_limit;
  std::string error;
};

class MpsOps {
 public:
  explicit MpsOps(MpsOpsOptions options);

  /// Managed: refuses (FAILED_PRECONDITION) when another user's daemon owns a pipe directory
  /// of GPUs 0..gpus-1.
  absl::Status Start(int gpus);
  /// Managed: daemons follow the tenants per GPU (index: GPU); a daemon that cannot start is
  /// logged and reported by Report(). No-op otherwise.
  void Reconcile(const std::vector<uint32_t>& tenants_per_gpu);
  /// Managed: quits the daemons. Idempotent.
  void Shutdown();

  /// Asks every daemon (bounded by the timeout per command).
  std::vector<MpsDaemonReport> Report() const;
  bool managed() const { return options_.manage; }

 private:
  MpsDaemonReport Ask(const MpsControlClient& client, MpsDaemonReport report) const;

  const MpsOpsOptions options_;
  std::unique_ptr<MpsManager> manager_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_MPS_OPS_H_
