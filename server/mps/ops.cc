#include "server/mps/ops.h"

#include <cstdlib>

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

absl::Status MpsOps::Start(int gpus) {
  if (manager_ == nullptr) return absl::OkStatus();
  std::vector<int> all;
  for (int gpu = 0; gpu < gpus; ++gpu) all.push_back(gpu);
  return manager_->CheckOwnership(all);
}

void MpsOps::Reconcile(const std::vector<uint32_t>& tenants_per_gpu) {
  if (manager_ == nullptr) return;
  absl::Status status = manager_->Reconcile(tenants_per_gpu);
  if (!status.ok()) spdlog::warn("--mps_manage: {}", status.message());
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
    for (const MpsManager::Daemon& d : manager_->daemons()) {
      MpsDaemonReport r{.gpu = d.gpu,
                        .pipe_directory = d.pipe_directory,
                        .pid = d.pid,
                        .managed = true,
                        .tenants = d.tenants,
                        .error = d.error};
      reports.push_back(Ask(manager_->ClientFor(d.gpu), std::move(r)));
    }
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
