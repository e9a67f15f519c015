#ifndef TESSERA_TESTS_TESTING_ETCD_PROCESS_H_
#define TESSERA_TESTS_TESTING_ETCD_PROCESS_H_

// A real etcd (Debian's etcd-server) for tests: one member on loopback ports, its data in a
// temporary directory; stopped (and restarted on the same ports and data) at will.
#include <memory>
#include <string>

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera::testing {

class EtcdProcess {
 public:
  /// Starts etcd (the binary on PATH, or $TESSERA_ETCD) and waits until it answers; its output
  /// goes to `log_path`'s file in `data_parent`. FAILED_PRECONDITION when there is no etcd.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(const std::string& data_parent);
  ~EtcdProcess();

  /// "http://127.0.0.1:PORT", for --fleet_etcd.
  std::string endpoint() const;

  /// Kills it (SIGKILL) and waits for it: etcd unreachable.
  void Stop();
  /// Starts it again on the same ports and data, and waits until it answers.
  absl::Status Restart();

 private:
  EtcdProcess() = default;
  absl::Status Launch();

  std::string binary_;
  std::string data_dir_;
  std::string log_path_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_ETCD_PROCESS_H_
