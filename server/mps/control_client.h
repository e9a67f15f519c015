#ifndef TESSERA_SERVER_MPS_CONTROL_CLIENT_H_
#define TESSERA_SERVER_MPS_CONTROL_CLIENT_H_

// A client for NVIDIA's MPS control daemon through its own command-line front end: each call
// runs `nvidia-cuda-mps-control` with CUDA_MPS_PIPE_DIRECTORY set, writes one command to its
// stdin, and parses what it prints. Every call is bounded by a timeout (the process is killed
// after it), so a hung daemon never blocks a thread for longer.
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tessera {

/// States of an MPS server (NVIDIA's MPS guide: get_server_status).
enum class MpsServerState { kUnknown, kInitializing, kActive, kFault };
absl::string_view MpsServerStateName(MpsServerState state);

/// One line of `ps`: PID ID SERVER DEVICE NAMESPACE COMMAND.
struct MpsClientProcess {
  pid_t pid = 0;
  std::string id;
  pid_t server = 0;
  std::string device;
  std::string pid_namespace;
  std::string command;
};

// Parsers of the daemon's replies (exposed for tests). INTERNAL naming the command and the
// text when a reply does not have the documented form.
absl::StatusOr<std::vector<pid_t>> ParsePidList(absl::string_view command, absl::string_view text);
absl::StatusOr<MpsServerState> ParseServerState(absl::string_view text);
absl::StatusOr<std::vector<MpsClientProcess>> ParsePs(absl::string_view text);
absl::StatusOr<double> ParsePercentage(absl::string_view text);

/// This process's environment with `overrides` (NAME, value) replacing or adding variables,
/// as "NAME=value" strings for posix_spawn.
std::vector<std::string> EnvironmentWith(
    const std::vector<std::pair<std::string, std::string>>& overrides);

/// posix_spawn attributes for the processes the server starts: an empty signal mask. The
/// server blocks SIGINT and SIGTERM in every thread but the one that waits for them (main.cc),
/// and a blocked mask survives exec: without this, the control daemon would ignore SIGTERM.
class SpawnAttributes {
 public:
  SpawnAttributes();
  ~SpawnAttributes();
  SpawnAttributes(const SpawnAttributes&) = delete;
  SpawnAttributes& operator=(const SpawnAttributes&) = delete;
  const posix_spawnattr_t* get() const { return &attributes_; }

 private:
  posix_spawnattr_t attributes_;
};

class MpsControlClient {
 public:
  struct Options {
    /// The control executable, looked up on PATH unless it contains a slash.
    std::string binary = "nvidia-cuda-mps-control";
    /// CUDA_MPS_PIPE_DIRECTORY for the call.
    std::string pipe_directory = "/tmp/nvidia-mps";
    absl::Duration timeout = absl::Seconds(5);
  };
  explicit MpsControlClient(Options options) : options_(std::move(options)) {}

  /// Runs one command and returns its standard output. FAILED_PRECONDITION when the binary
  /// cannot be run or the daemon rejects the command; UNAVAILABLE when the daemon is not
  /// running, the front end exits non-zero or dies of a signal; DEADLINE_EXCEEDED when it does
  /// not finish within the timeout (it is then killed).
  absl::StatusOr<std::string> Run(absl::string_view command) const;

  absl::StatusOr<std::vector<pid_t>> GetServerList() const;
  absl::StatusOr<MpsServerState> GetServerStatus(pid_t server) const;
  absl::StatusOr<std::vector<pid_t>> GetClientList(pid_t server) const;
  absl::StatusOr<std::vector<MpsClientProcess>> Ps() const;
  absl::StatusOr<double> GetDefaultActiveThreadPercentage() const;
  /// INVALID_ARGUMENT unless 0 < percentage <= 100.
  absl::Status SetDefaultActiveThreadPercentage(double percentage) const;
  /// The reply as printed (e.g. "10G"; the daemon's own wording when no limit is set).
  absl::StatusOr<std::string> GetDefaultDevicePinnedMemLimit(int device) const;
  /// `value` is an integer followed by G or M (INVALID_ARGUMENT otherwise).
  absl::Status SetDefaultDevicePinnedMemLimit(int device, absl::string_view value) const;
  /// Terminates the GPU work of client process `client` on server `server`; the daemon
  /// answers 0 on success, otherwise the CUDA error (UNAVAILABLE with it).
  absl::Status TerminateClient(pid_t server, pid_t client) const;
  absl::Status Quit() const;

  const Options& options() const { return options_; }

 private:
  Options options_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_MPS_CONTROL_CLIENT_H_
