#ifndef TESSERA_SERVER_BACKEND_MPS_PROBE_H_
#define TESSERA_SERVER_BACKEND_MPS_PROBE_H_

#include <optional>
#include <string>

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "server/backend/backend.h"

namespace tessera {

/// The MPS pipe directory when CUDA_MPS_PIPE_DIRECTORY is unset (NVIDIA's MPS guide).
inline constexpr char kDefaultMpsPipeDirectory[] = "/tmp/nvidia-mps";
/// The control daemon writes its pid here, inside the pipe directory.
inline constexpr char kMpsControlPidFile[] = "nvidia-cuda-mps-control.pid";

/// What the host says about an MPS control daemon, before asking the daemon itself.
struct MpsProbe {
  /// CUDA_MPS_PIPE_DIRECTORY when set and non-empty, else /tmp/nvidia-mps.
  std::string pipe_directory;
  bool directory_found = false;
  /// From the pid file, when it holds a positive number.
  std::optional<pid_t> daemon_pid;
  /// The pid is a live process whose program is nvidia-cuda-mps-control (or whose command
  /// line cannot be read). A pid reused by another program is a stale pid file.
  bool daemon_running = false;
  /// It is alive but belongs to another user (kill(pid, 0) is EPERM): this server is then
  /// not the MPS user and cannot be its client.
  bool daemon_other_user = false;
  /// The pid file names a pid that is not a process here: the daemon exited, or it runs in
  /// another PID namespace (another container). Under --mps=require the driver decides.
  bool daemon_not_visible = false;
  /// One line saying what was found, for decisions, logs and GetServerInfo.
  std::string summary;
};

/// The control daemon's program name (argv[0] without its directory).
inline constexpr char kMpsControlProgram[] = "nvidia-cuda-mps-control";

/// Whether `pid` is a live process (not exited, not a zombie awaiting its parent).
bool ProcessAlive(pid_t pid);

/// argv[0] of process `pid` without its directory ("" when unreadable: gone, or hidden).
std::string ProgramName(pid_t pid);

/// Looks at `pipe_directory_env` (the value of CUDA_MPS_PIPE_DIRECTORY; nullptr when unset)
/// or the default, and at the control daemon's pid file there.
MpsProbe ProbeMps(const char* pipe_directory_env);

/// INVALID_ARGUMENT naming the flag unless `mode` is "auto", "require" or "off".
absl::Status CheckMpsMode(absl::string_view mode);

/// The decision for `--mps=mode` ("auto", "require", "off") on a CUDA host given `probe`:
/// MPS when a daemon of this user runs and the mode allows it, FALLBACK otherwise, each
/// with its reason. `require` without a usable daemon is FAILED_PRECONDITION naming what is
/// missing, except for a pid file whose process is not visible here (a daemon in another
/// container): then MPS, and the caller must check that the driver did connect. An unknown
/// mode is INVALID_ARGUMENT.
struct MpsChoice {
  MpsDecision decision = MpsDecision::kFallback;
  std::string reason;
};
absl::StatusOr<MpsChoice> DecideMps(absl::string_view mode, const MpsProbe& probe);

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_MPS_PROBE_H_
