#include "server/mps/manager.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "server/backend/mps_probe.h"

namespace tessera {
namespace {

bool Alive(pid_t pid) { return ProcessAlive(pid); }

}  // namespace

std::string MpsManager::PipeDirectory(int gpu) const {
  return absl::StrCat(options_.base_directory, "/gpu", gpu, "/pipe");
}

MpsControlClient MpsManager::ClientFor(int gpu) const {
  return MpsControlClient({.binary = options_.binary,
                           .pipe_directory = PipeDirectory(gpu),
                           .timeout = options_.timeout});
}

absl::Status MpsManager::CheckOwnership(const std::vector<int>& gpus) const {
  for (int gpu : gpus) {
    const std::string dir = PipeDirectory(gpu);
    MpsProbe probe = ProbeMps(dir.c_str());
    if (probe.daemon_other_user) {
      return absl::FailedPreconditionError(
          absl::StrCat("--mps_manage: another user's MPS control daemon (pid ", *probe.daemon_pid,
                       ") owns ", dir,
                       "; run tessera-server as that user (the MPS user), stop that daemon, "
                       "or choose another --mps_base_dir"));
    }
  }
  return absl::OkStatus();
}

absl::Status MpsManager::Reconcile(const std::vector<uint32_t>& tenants_per_gpu) {
  absl::MutexLock lock(&mu_);
  absl::Status first;
  for (size_t gpu = 0; gpu < tenants_per_gpu.size(); ++gpu) {
    Daemon& d = daemons_[static_cast<int>(gpu)];
    d.gpu = static_cast<int>(gpu);
    d.pipe_directory = PipeDirectory(d.gpu);
    d.log_directory = absl::StrCat(options_.base_directory, "/gpu", gpu, "/log");
    const uint32_t before = d.tenants;
    d.tenants = tenants_per_gpu[gpu];
    absl::Status s;
    if (d.tenants > 0 && !Alive(d.pid)) {
      if (d.pid != 0) {
        spdlog::warn(
            "MPS control daemon for GPU {} (pid {}) died; starting it again for its {} "
            "tenant(s)",
            gpu, d.pid, d.tenants);
        d.pid = 0;
      }
      s = StartLocked(d);
    } else if (d.tenants == 0 && before > 0 && d.pid != 0) {
      StopLocked(d);
    }
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::Status MpsManager::StartLocked(Daemon& d) {
  std::error_code ec;
  std::filesystem::create_directories(d.pipe_directory, ec);
  if (!ec) std::filesystem::create_directories(d.log_directory, ec);
  if (ec) {
    d.error = absl::StrCat("cannot create ", d.pipe_directory, " or ", d.log_directory, ": ",
                           ec.message());
    return absl::FailedPreconditionError(d.error);
  }
  MpsProbe probe = ProbeMps(d.pipe_directory.c_str());
  if (probe.daemon_other_user) {
    d.error = absl::StrCat("another user's MPS control daemon (pid ", *probe.daemon_pid, ") owns ",
                           d.pipe_directory, "; not starting one");
    return absl::FailedPreconditionError(d.error);
  }
  if (probe.daemon_running) {  // ours, e.g. left by an earlier run: adopt it
    d.pid = *probe.daemon_pid;
    d.error.clear();
    spdlog::info("MPS control daemon for GPU {} already running (pid {}); using it", d.gpu, d.pid);
    return absl::OkStatus();
  }
  std::vector<std::string> env_storage =
      EnvironmentWith({{"CUDA_VISIBLE_DEVICES", absl::StrCat(d.gpu)},
                       {"CUDA_MPS_PIPE_DIRECTORY", d.pipe_directory},
                       {"CUDA_MPS_LOG_DIRECTORY", d.log_directory}});
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
    d.error = absl::StrCat("cannot run ", binary, " -d: ", std::strerror(spawned));
    return absl::FailedPreconditionError(d.error);
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
    d.error =
        absl::StrCat(binary, " -d did not return within ", absl::FormatDuration(options_.timeout));
    return absl::UnavailableError(d.error);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    d.error = absl::StrCat(binary, " -d failed (status ", status, "); see ", d.log_directory,
                           "/control.log");
    return absl::UnavailableError(d.error);
  }
  while (absl::Now() < deadline) {
    probe = ProbeMps(d.pipe_directory.c_str());
    if (probe.daemon_running && !probe.daemon_other_user) {
      d.pid = *probe.daemon_pid;
      d.error.clear();
      spdlog::info("started the MPS control daemon for GPU {} (pid {}, pipe directory {})", d.gpu,
                   d.pid, d.pipe_directory);
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  d.error = absl::StrCat("the MPS control daemon for GPU ", d.gpu, " wrote no pid file in ",
                         d.pipe_directory, " within ", absl::FormatDuration(options_.timeout));
  return absl::UnavailableError(d.error);
}

void MpsManager::StopLocked(Daemon& d) {
  absl::Status quit = ClientFor(d.gpu).Quit();
  if (!quit.ok()) {
    d.error = absl::StrCat("quit: ", quit.message());
    spdlog::warn("MPS control daemon for GPU {} (pid {}): {}", d.gpu, d.pid, d.error);
  } else {
    spdlog::info("stopped the MPS control daemon for GPU {} (pid {})", d.gpu, d.pid);
    d.error.clear();
  }
  d.pid = 0;
}

void MpsManager::Shutdown() {
  absl::MutexLock lock(&mu_);
  for (auto& [gpu, d] : daemons_) {
    if (d.pid != 0) StopLocked(d);
  }
}

std::vector<MpsManager::Daemon> MpsManager::daemons() const {
  absl::MutexLock lock(&mu_);
  std::vector<Daemon> out;
  for (const auto& [gpu, d] : daemons_) {
    Daemon copy = d;
    if (!Alive(copy.pid)) copy.pid = 0;
    out.push_back(std::move(copy));
  }
  return out;
}

}  // namespace tessera
