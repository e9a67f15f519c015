#include "server/mps/manager.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "server/backend/mps_probe.h"

namespace tessera {
namespace {

// Makes `dir` (and its parents) and restricts it to this user: the daemon, its servers and
// this process share one uid, and nobody else has business in the pipes.
absl::Status MakePrivateDirectory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--mps_manage: cannot create ", dir, ": ", ec.message()));
  }
  if (chmod(dir.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--mps_manage: cannot restrict ", dir, " to mode 0700: ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ProcessEnvironmentValue(pid_t pid, const std::string& name) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string prefix = name + "=";
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    if (text.compare(start, prefix.size(), prefix) == 0) {
      return text.substr(start + prefix.size(), end - start - prefix.size());
    }
    start = end + 1;
  }
  return "";
}

MpsManager::MpsManager(Options options)
    : options_(std::move(options)),
      pipe_directory_(options_.base_directory + "/pipe"),
      log_directory_(options_.base_directory + "/log") {
  daemon_.pipe_directory = pipe_directory_;
  daemon_.log_directory = log_directory_;
}

MpsControlClient MpsManager::Client() const {
  return MpsControlClient(
      {.binary = options_.binary, .pipe_directory = pipe_directory_, .timeout = options_.timeout});
}

absl::Status MpsManager::Start() {
  absl::MutexLock lock(&mu_);
  absl::Status s = MakePrivateDirectory(pipe_directory_);
  if (s.ok()) s = MakePrivateDirectory(log_directory_);
  if (s.ok()) {
    MpsProbe probe = ProbeMps(pipe_directory_.c_str());
    if (probe.daemon_other_user) {
      s = absl::FailedPreconditionError(absl::StrCat(
          "--mps_manage: another user's MPS control daemon (pid ", *probe.daemon_pid, ") owns ",
          pipe_directory_,
          "; run tessera-server as that user (the MPS user), stop that daemon, or choose "
          "another --mps_base_dir"));
    } else if (probe.daemon_running) {
      // Ours, left by an earlier run: join it, but it was not started here, so it stays.
      daemon_.pid = *probe.daemon_pid;
      daemon_.started = false;
      spdlog::info(
          "--mps_manage: MPS control daemon already running (pid {}, pipe directory {}); "
          "joining it and leaving it running at shutdown",
          daemon_.pid, pipe_directory_);
    } else {
      if (probe.daemon_pid.has_value()) {
        // The pipe directory is this server's own: a pid file that outlived its daemon (a
        // container restarted with the directory on a surviving volume) goes.
        spdlog::info("--mps_manage: removing a stale pid file ({})", probe.summary);
        std::filesystem::remove(absl::StrCat(pipe_directory_, "/", kMpsControlPidFile));
      }
      s = SpawnLocked();
    }
  }
  if (!s.ok()) {
    daemon_.error = std::string(s.message());
    return s;
  }
  daemon_.error.clear();
  daemon_.visible_devices = ProcessEnvironmentValue(daemon_.pid, "CUDA_VISIBLE_DEVICES");
  // The driver reads these when it initializes; nothing has initialized it yet.
  setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_directory_.c_str(), 1);
  setenv("CUDA_MPS_LOG_DIRECTORY", log_directory_.c_str(), 1);
  if (!daemon_.visible_devices.empty()) {
    spdlog::info(
        "--mps_manage: the MPS server renumbers the daemon's CUDA_VISIBLE_DEVICES={} from 0; "
        "removing the variable from this process so the devices are not filtered twice",
        daemon_.visible_devices);
    unsetenv("CUDA_VISIBLE_DEVICES");
  }
  return absl::OkStatus();
}

absl::Status MpsManager::SpawnLocked() {
  std::vector<std::string> env_storage = EnvironmentWith(
      {{"CUDA_MPS_PIPE_DIRECTORY", pipe_directory_}, {"CUDA_MPS_LOG_DIRECTORY", log_directory_}});
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string binary = options_.binary;
  std::string daemon_flag = "-d";
  char* argv[] = {binary.data(), daemon_flag.data(), nullptr};
  pid_t launcher = -1;
  SpawnAttributes attributes;
  int spawned =
      posix_spawnp(&launcher, binary.c_str(), nullptr, attributes.get(), argv, envp.data());
  if (spawned != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--mps_manage: cannot run ", binary, " -d: ", std::strerror(spawned)));
  }
  // `-d` forks the daemon and returns; then the daemon writes its pid file.
  const absl::Time deadline = absl::Now() + options_.timeout;
  int status = 0;
  bool exited = false;
  while (absl::Now() < deadline) {
    if (waitpid(launcher, &status, WNOHANG) == launcher) {
      exited = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (!exited) {
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
    return absl::UnavailableError(absl::StrCat("--mps_manage: ", binary,
                                               " -d did not return within ",
                                               absl::FormatDuration(options_.timeout)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(absl::StrCat("--mps_manage: ", binary, " -d failed (status ",
                                               status, "); see ", log_directory_, "/control.log"));
  }
  while (absl::Now() < deadline) {
    MpsProbe probe = ProbeMps(pipe_directory_.c_str());
    if (probe.daemon_running && !probe.daemon_other_user) {
      daemon_.pid = *probe.daemon_pid;
      daemon_.started = true;
      spdlog::info("--mps_manage: started the MPS control daemon (pid {}, pipe directory {})",
                   daemon_.pid, pipe_directory_);
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::UnavailableError(
      absl::StrCat("--mps_manage: the MPS control daemon wrote no pid file in ", pipe_directory_,
                   " within ", absl::FormatDuration(options_.timeout)));
}

void MpsManager::Check() {
  absl::MutexLock lock(&mu_);
  if (daemon_.pid == 0 || ProcessAlive(daemon_.pid)) return;
  daemon_.error = absl::StrCat(
      "the MPS control daemon (pid ", daemon_.pid,
      ") exited; this process joined it when the CUDA driver initialized and cannot join "
      "another: restart tessera-server to use MPS again");
  spdlog::error("--mps_manage: {}", daemon_.error);
  daemon_.pid = 0;
}

void MpsManager::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (daemon_.pid == 0 || !ProcessAlive(daemon_.pid)) return;
  if (!daemon_.started) {
    spdlog::info("--mps_manage: leaving the MPS control daemon (pid {}) running: not started here",
                 daemon_.pid);
    return;
  }
  // Other processes pointed at this pipe directory may still be its clients; this process
  // stays one until it exits (the driver detaches at process exit), so it does not count.
  const MpsControlClient client = Client();
  std::vector<pid_t> others;
  absl::StatusOr<std::vector<pid_t>> servers = client.GetServerList();
  if (servers.ok()) {
    for (pid_t server : *servers) {
      absl::StatusOr<std::vector<pid_t>> clients = client.GetClientList(server);
      if (!clients.ok()) continue;
      for (pid_t c : *clients) {
        if (c != getpid() && ProcessAlive(c)) others.push_back(c);
      }
    }
  } else {
    spdlog::warn("--mps_manage: cannot list the daemon's clients ({}); quitting it anyway",
                 std::string(servers.status().message()));
  }
  if (!others.empty()) {
    spdlog::warn(
        "--mps_manage: leaving the MPS control daemon (pid {}) running for its other client(s) "
        "[{}]; stop it with `echo quit | CUDA_MPS_PIPE_DIRECTORY={} nvidia-cuda-mps-control`",
        daemon_.pid, absl::StrJoin(others, ", "), pipe_directory_);
    return;
  }
  absl::Status quit = client.Quit();
  if (!quit.ok()) {
    daemon_.error = absl::StrCat("quit: ", quit.message());
    spdlog::warn("--mps_manage: MPS control daemon (pid {}): {}", daemon_.pid, daemon_.error);
    return;
  }
  spdlog::info("--mps_manage: stopped the MPS control daemon (pid {})", daemon_.pid);
  daemon_.pid = 0;
}

MpsManager::Daemon MpsManager::daemon() const {
  absl::MutexLock lock(&mu_);
  Daemon copy = daemon_;
  if (!ProcessAlive(copy.pid)) copy.pid = 0;
  return copy;
}

}  // namespace tessera
