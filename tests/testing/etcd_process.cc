#include "tests/testing/etcd_process.h"

#include <cstdlib>
#include <filesystem>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "server/fleet/etcd_client.h"
#include "tests/testing/server_process.h"

namespace tessera::testing {

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(const std::string& data_parent) {
  std::unique_ptr<EtcdProcess> etcd(new EtcdProcess());
  const char* env = std::getenv("TESSERA_ETCD");
  etcd->binary_ = env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
  if (access(etcd->binary_.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(etcd->binary_, " is not there: install etcd-server (deploy/install-deps.sh)"));
  }
  std::error_code made;
  std::filesystem::create_directories(data_parent, made);
  etcd->data_dir_ = absl::StrCat(data_parent, "/etcd");
  etcd->log_path_ = absl::StrCat(data_parent, "/etcd.log");
  etcd->client_port_ = FreePort();
  etcd->peer_port_ = FreePort();
  if (absl::Status launched = etcd->Launch(); !launched.ok()) return launched;
  return etcd;
}

EtcdProcess::~EtcdProcess() { Stop(); }

std::string EtcdProcess::endpoint() const {
  return absl::StrCat("http://127.0.0.1:", client_port_);
}

absl::Status EtcdProcess::Launch() {
  const std::string client = endpoint();
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path_));
  absl::StatusOr<pid_t> pid = StartProcess(
      {binary_, "--name=test", absl::StrCat("--data-dir=", data_dir_),
       absl::StrCat("--listen-client-urls=", client),
       absl::StrCat("--advertise-client-urls=", client), absl::StrCat("--listen-peer-urls=", peer),
       absl::StrCat("--initial-advertise-peer-urls=", peer),
       absl::StrCat("--initial-cluster=test=", peer), "--log-level=error"},
      {{"ETCD_UNSUPPORTED_ARCH", ""}}, -1, log);
  close(log);
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  auto client_or = fleet::EtcdClient::Create({.endpoints = {client}, .timeout = absl::Seconds(1)});
  if (!client_or.ok()) return client_or.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  absl::Status last;
  while (absl::Now() < deadline) {
    last = (*client_or)->Get("/tessera-test-probe").status();
    if (last.ok()) return absl::OkStatus();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("etcd exited at start; see ", log_path_));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("etcd did not answer within 20 s (", last.message(), "); see ", log_path_));
}

void EtcdProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

absl::Status EtcdProcess::Restart() {
  Stop();
  return Launch();
}

}  // namespace tessera::testing
