#include "server/backend/mps_probe.h"

#include <cerrno>
#include <fstream>
#include <string>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#include "server/common/status_macros.h"

namespace tessera {

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == EPERM;  // exists, but is not ours to signal
  // A zombie still answers kill(); its state in /proc/<pid>/stat (after "(comm)") is Z.
  std::ifstream stat_file(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() || text[close + 2] != 'Z';
}

std::string ProgramName(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"), std::ios::binary);
  std::string argv0;
  if (!std::getline(in, argv0, '\0')) return "";
  return argv0.substr(argv0.rfind('/') + 1);
}

MpsProbe ProbeMps(const char* pipe_directory_env) {
  MpsProbe probe;
  probe.pipe_directory = pipe_directory_env != nullptr && pipe_directory_env[0] != '\0'
                             ? pipe_directory_env
                             : kDefaultMpsPipeDirectory;
  const std::string where = absl::StrCat("pipe directory ", probe.pipe_directory);
  struct stat st {};
  if (stat(probe.pipe_directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    probe.summary = absl::StrCat("no MPS control daemon: ", where, " does not exist");
    return probe;
  }
  probe.directory_found = true;
  const std::string pid_path = absl::StrCat(probe.pipe_directory, "/", kMpsControlPidFile);
  std::ifstream in(pid_path);
  if (!in) {
    probe.summary = absl::StrCat("no MPS control daemon: ", where, " has no ", kMpsControlPidFile);
    return probe;
  }
  std::string text;
  std::getline(in, text);
  int pid = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid) || pid <= 0) {
    probe.summary = absl::StrCat("no MPS control daemon: ", pid_path, " does not hold a pid");
    return probe;
  }
  probe.daemon_pid = static_cast<pid_t>(pid);
  // Another user's daemon: signalling it is refused (EPERM), or, for root, which may signal
  // anyone, its /proc entry belongs to someone else.
  const pid_t daemon = static_cast<pid_t>(pid);
  struct stat proc {};
  bool alive = ProcessAlive(daemon);
  // A pid file that outlived its daemon may name a process that reused the pid: after a
  // container restart with the pipe directory on a surviving volume, it is often one of this
  // server's own threads. Only the control daemon itself counts.
  const std::string program = alive ? ProgramName(daemon) : "";
  if (alive && !program.empty() && program != kMpsControlProgram) {
    probe.summary = absl::StrCat("no MPS control daemon: pid ", pid, " from ", pid_path, " is now ",
                                 program, ", not ", kMpsControlProgram, " (a stale pid file)");
    return probe;
  }
  const bool foreign =
      alive &&
      ((kill(daemon, 0) != 0 && errno == EPERM) ||
       (stat(absl::StrCat("/proc/", pid).c_str(), &proc) == 0 && proc.st_uid != geteuid()));
  if (alive && !foreign) {
    probe.daemon_running = true;
    probe.summary = absl::StrCat("MPS control daemon running (pid ", pid, ", ", where, ")");
  } else if (foreign) {
    probe.daemon_running = true;
    probe.daemon_other_user = true;
    probe.summary = absl::StrCat("MPS control daemon pid ", pid, " (", where,
                                 ") belongs to another user; run tessera-server as the MPS "
                                 "user, or the daemon in multi-user mode");
  } else {
    // Either the daemon exited, or it runs in another PID namespace (another container, as
    // with the NVIDIA device plugin's MPS daemon), which this process cannot see.
    probe.daemon_not_visible = true;
    probe.summary = absl::StrCat("no MPS control daemon: pid ", pid, " from ", pid_path,
                                 " is not running here (a stale pid file, or a daemon in "
                                 "another PID namespace)");
  }
  return probe;
}

absl::Status CheckMpsMode(absl::string_view mode) {
  if (mode == "auto" || mode == "require" || mode == "off") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--mps=", mode, ": allowed values are auto, require, off"));
}

absl::StatusOr<MpsChoice> DecideMps(absl::string_view mode, const MpsProbe& probe) {
  RETURN_IF_ERROR(CheckMpsMode(mode));
  if (mode == "off") return MpsChoice{MpsDecision::kFallback, "--mps=off"};
  const bool usable = probe.daemon_running && !probe.daemon_other_user;
  if (usable) {
    return MpsChoice{MpsDecision::kMps, absl::StrCat("--mps=", mode, ": ", probe.summary)};
  }
  if (mode == "require" && probe.daemon_not_visible) {
    // The operator says MPS is there. The driver connects through the pipe directory, not
    // the pid, so it has the last word: the CUDA backend checks that it did connect
    // (CU_DEVICE_ATTRIBUTE_MPS_ENABLED) and fails the start otherwise.
    return MpsChoice{MpsDecision::kMps,
                     absl::StrCat("--mps=require: ", probe.summary,
                                  "; trusting the pipe directory, the driver must connect")};
  }
  if (mode == "require") {
    return absl::FailedPreconditionError(absl::StrCat("--mps=require: ", probe.summary,
                                                      "; start nvidia-cuda-mps-control -d as "
                                                      "this user, or use --mps=auto"));
  }
  return MpsChoice{MpsDecision::kFallback, absl::StrCat("--mps=auto: ", probe.summary)};
}

}  // namespace tessera
