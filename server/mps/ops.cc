#include "server/mps/ops.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "server/backend/mps_probe.h"
#include "server/common/logging.h"

namespace tessera {

MpsOps::MpsOps(MpsOpsOptions options) : options_(std::move(options)) {
  if (options_.manage) {
    manager_ =
        std::make_unique<MpsManager>(MpsManager::Options{.base_directory = options_.base_directory,
                                                         .binary = options_.binary,
                                                         .timeout = options_.timeout});
  }
}

absl::Status MpsOps::StartBeforeDriver(const std::string& backend, const std::string& mps,
                                       bool driver_present) {
  if (manager_ == nullptr) return absl::OkStatus();
  if (mps == "off") {
    return absl::InvalidArgumentError(
        "--mps_manage starts an MPS control daemon for the tenants' contexts to join, and "
        "--mps=off keeps them from joining one; drop one of the two");
  }
  if (backend == "cpu") {
    not_started_ = "not started: --backend=cpu";
  } else if (!driver_present) {
    not_started_ = "not started: no CUDA driver (libcuda.so.1) on this host";
  }
  if (!not_started_.empty()) {
    spdlog::warn("--mps_manage: {}", not_started_);
    return absl::OkStatus();
  }
  absl::Status started = manager_->Start();
  if (started.ok() || mps == "require") return started;
  spdlog::warn("{}; continuing without MPS (--mps=auto)", std::string(started.message()));
  return absl::OkStatus();
}

void MpsOps::NotNeeded(const std::string& why) {
  if (manager_ == nullptr || !not_started_.empty()) return;
  not_started_ = absl::StrCat("not used: ", why);
  spdlog::warn("--mps_manage: the CUDA backend does not serve ({}); stopping the daemon", why);
  manager_->Shutdown();
}

void MpsOps::Reconcile(const std::vector<uint32_t>& tenants_per_gpu) {
  if (manager_ == nullptr) return;
  uint32_t total = 0;
  for (uint32_t n : tenants_per_gpu) total += n;
  tenants_.store(total, std::memory_order_relaxed);
  if (not_started_.empty()) manager_->Check();
}

void MpsOps::Shutdown() {
  if (manager_ != nullptr) manager_->Shutdown();
}

MpsDaemonReport MpsOps::Ask(const MpsControlClient& client, MpsDaemonReport report) const {
  if (report.pid == 0) {
    if (report.error.empty()) report.error = "no control daemon is running";
    return report;
  }
  absl::StatusOr<std::vector<pid_t>> servers = client.GetServerList();
  if (!servers.ok()) {
    report.error = std::string(servers.status().message());
    return report;
  }
  for (pid_t pid : *servers) {
    MpsServerReport server{.pid = pid};
    absl::StatusOr<MpsServerState> state = client.GetServerStatus(pid);
    if (state.ok()) server.state = *state;
    absl::StatusOr<std::vector<pid_t>> clients = client.GetClientList(pid);
    if (clients.ok()) server.clients = *clients;
    if ((!state.ok() || !clients.ok()) && report.error.empty()) {
      report.error = std::string((!state.ok() ? state.status() : clients.status()).message());
    }
    report.servers.push_back(std::move(server));
  }
  absl::StatusOr<double> percentage = client.GetDefaultActiveThreadPercentage();
  if (percentage.ok()) report.default_active_thread_percentage = *percentage;
  absl::StatusOr<std::string> limit = client.GetDefaultDevicePinnedMemLimit(0);
  if (limit.ok()) report.default_pinned_mem_limit = *limit;
  return report;
}

std::vector<MpsDaemonReport> MpsOps::Report() const {
  std::vector<MpsDaemonReport> reports;
  if (manager_ != nullptr) {
    const MpsManager::Daemon d = manager_->daemon();
    MpsDaemonReport r{.gpu = -1,
                      .pipe_directory = d.pipe_directory,
                      .log_directory = d.log_directory,
                      .pid = d.pid,
                      .managed = true,
                      .started = d.started,
                      .tenants = tenants_.load(std::memory_order_relaxed),
                      .error = d.error.empty() ? not_started_ : d.error};
    reports.push_back(Ask(manager_->Client(), std::move(r)));
    return reports;
  }
  MpsProbe probe = ProbeMps(std::getenv("CUDA_MPS_PIPE_DIRECTORY"));
  MpsDaemonReport r{.gpu = -1,
                    .pipe_directory = probe.pipe_directory,
                    .pid = probe.daemon_running ? *probe.daemon_pid : 0};
  if (!probe.daemon_running) r.error = probe.summary;
  if (probe.daemon_other_user) {
    r.error = probe.summary;
    r.pid = *probe.daemon_pid;
    reports.push_back(std::move(r));
    return reports;
  }
  reports.push_back(Ask(MpsControlClient({.binary = options_.binary,
                                          .pipe_directory = probe.pipe_directory,
                                          .timeout = options_.timeout}),
                        std::move(r)));
  return reports;
}

}  // namespace tessera
