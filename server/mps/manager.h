#ifndef TESSERA_SERVER_MPS_MANAGER_H_
#define TESSERA_SERVER_MPS_MANAGER_H_

// --mps_manage: one MPS control daemon for the GPUs this server serves, under
// <base>/pipe and <base>/log, started (or found running) BEFORE the CUDA driver initializes.
//
// Why one, and why first: the driver connects a process to the control daemon of the
// CUDA_MPS_PIPE_DIRECTORY it sees when CUDA is first initialized (NVIDIA's MPS guide, 3.3.2
// "Client Attach/Detach"), once; a process is the client of that daemon or of none. So the
// manager starts the daemon, then points this process's environment at it, and only then may
// the backend load the CUDA module. One daemon serves every visible GPU (guide, 2.3.4 "MPS on
// Multi-GPU Systems"); it inherits this process's CUDA_VISIBLE_DEVICES, and because the MPS
// server then renumbers the devices (guide, 4.2.1), the variable is removed from this
// process's environment so the client does not filter them a second time.
//
// At shutdown a daemon this manager started is sent `quit` once no client other than this
// process remains; a daemon it found running is left alone. Thread-safe.
#include <string>

#include <sys/types.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "server/mps/control_client.h"

namespace tessera {

class MpsManager {
 public:
  struct Options {
    /// pipe/ and log/ are made under it (mode 0700: the daemon, its servers and this process
    /// run as one user).
    std::string base_directory;
    /// nvidia-cuda-mps-control (PATH lookup unless it contains a slash).
    std::string binary = "nvidia-cuda-mps-control";
    /// For each control command, and for a started daemon to write its pid file.
    absl::Duration timeout = absl::Seconds(5);
  };

  /// What the manager knows of its daemon.
  struct Daemon {
    std::string pipe_directory;
    std::string log_directory;
    /// 0 when not running.
    pid_t pid = 0;
    /// Started by this manager (quit at shutdown); false for one found running.
    bool started = false;
    /// The daemon's CUDA_VISIBLE_DEVICES ("" when unset or unknown).
    std::string visible_devices;
    /// The last error starting, watching or stopping it (empty when fine).
    std::string error;
  };

  explicit MpsManager(Options options);
  ~MpsManager() { Shutdown(); }
  MpsManager(const MpsManager&) = delete;
  MpsManager& operator=(const MpsManager&) = delete;

  /// Starts the daemon, or adopts one of this user already running in the pipe directory,
  /// then sets CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY in this process's
  /// environment (and unsets CUDA_VISIBLE_DEVICES when the daemon has one). Call once, before
  /// the CUDA driver initializes and while no other thread reads the environment.
  /// FAILED_PRECONDITION when another user's daemon owns the pipe directory (this server must
  /// run as the MPS user) or the directories cannot be made; UNAVAILABLE when the daemon does
  /// not come up within the timeout.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);

  /// Notices a daemon that died (logged once, kept in `error`). It is not started again: this
  /// process joined it when the driver initialized and cannot join another, so only a restart
  /// of tessera-server brings MPS back.
  void Check() ABSL_LOCKS_EXCLUDED(mu_);

  /// Quits a daemon this manager started once no client but this process remains (a daemon
  /// with other clients is left running and logged); leaves a found one alone. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  Daemon daemon() const ABSL_LOCKS_EXCLUDED(mu_);
  /// A control client for the daemon.
  MpsControlClient Client() const;
  const std::string& pipe_directory() const { return pipe_directory_; }

 private:
  absl::Status SpawnLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::string pipe_directory_;
  const std::string log_directory_;
  mutable absl::Mutex mu_;
  Daemon daemon_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

/// The value of `name` in process `pid`'s initial environment (/proc/PID/environ), or "" when
/// unset or unreadable.
std::string ProcessEnvironmentValue(pid_t pid, const std::string& name);

}  // namespace tessera

#endif  // TESSERA_SERVER_MPS_MANAGER_H_
