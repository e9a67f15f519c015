#ifndef TESSERA_SERVER_MPS_OPS_H_
#define TESSERA_SERVER_MPS_OPS_H_

// What the admin API sees of MPS: the control daemon (started or found by --mps_manage, or
// the one found through CUDA_MPS_PIPE_DIRECTORY) and what it says about servers and clients.
#include <atomic>
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
  /// --mps_manage: run one control daemon for this server's GPUs (server/mps/manager.h).
  bool manage = false;
  /// --mps_base_dir: pipe/ and log/ of the managed daemon.
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
  /// -1: all the GPUs this server sees (the only kind of daemon there is now).
  int gpu = -1;
  std::string pipe_directory;
  std::string log_directory;
  pid_t pid = 0;
  bool managed = false;
  /// Managed and started by this server (quit at shutdown); false for one found running.
  bool started = false;
  uint32_t tenants = 0;
  std::vector<MpsServerReport> servers;
  double default_active_thread_percentage = 0;
  std::string default_pinned_mem_limit;
  std::string error;
};

class MpsOps {
 public:
  explicit MpsOps(MpsOpsOptions options);

  /// Managed: starts (or finds) the control daemon and points this process's environment
  /// at it. Must run before the backend initializes the CUDA driver, which joins the daemon
  /// of CUDA_MPS_PIPE_DIRECTORY once, at initialization. Nothing is started for --backend=cpu
  /// or on a host without the CUDA driver (said in the log and the report). --mps=off with
  /// --mps_manage is INVALID_ARGUMENT; a daemon that cannot start is an error under
  /// --mps=require and a warning under --mps=auto (the backend then decides without MPS).
  /// `driver_present`: whether libcuda.so.1 loads here (CudaDriverPresent()).
  absl::Status StartBeforeDriver(const std::string& backend, const std::string& mps,
                                 bool driver_present);
  /// Managed: the backend that serves is not the CUDA one, so a daemon started here is quit.
  void NotNeeded(const std::string& why);
  /// Records the tenants per GPU (index: GPU) for the report and notices a managed daemon
  /// that died. No-op unless managed.
  void Reconcile(const std::vector<uint32_t>& tenants_per_gpu);
  /// Managed: quits a daemon started here once no other client remains. Idempotent.
  void Shutdown();

  /// Asks the daemon (bounded by the timeout per command).
  std::vector<MpsDaemonReport> Report() const;
  bool managed() const { return options_.manage; }

 private:
  MpsDaemonReport Ask(const MpsControlClient& client, MpsDaemonReport report) const;

  const MpsOpsOptions options_;
  std::unique_ptr<MpsManager> manager_;
  std::atomic<uint32_t> tenants_{0};
  /// Why a managed daemon was not started ("" when it was asked for); set before serving.
  std::string not_started_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_MPS_OPS_H_
