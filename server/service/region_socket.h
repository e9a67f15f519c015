#ifndef TESSERA_SERVER_SERVICE_REGION_SOCKET_H_
#define TESSERA_SERVER_SERVICE_REGION_SOCKET_H_

#include <memory>
#include <string>
#include <thread>

#include <sys/types.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

class RegionTickets;

/// The descriptor socket: a Unix stream socket beside --unix_socket (PATH.regions) on which a
/// client hands over a memfd with SCM_RIGHTS (docs/api.md, "Regions", step 2). Per
/// connection: one message whose bytes are a ticket and a newline and whose ancillary data
/// carries exactly one descriptor; the server answers one line, "OK\n" or
/// "ERR <CODE> <message>\n" (CODE a gRPC status code name), and closes the connection.
///
/// A thread accepts; each connection is served on a thread of its own (at most
/// kMaxConnections at once; more are answered ERR RESOURCE_EXHAUSTED), and one that sends
/// nothing for kReceiveTimeout is closed. Descriptors are received close-on-exec and never
/// leak: each is mapped or closed before the connection ends.
class RegionSocket {
 public:
  static constexpr int kMaxConnections = 16;
  static constexpr int kReceiveTimeoutMs = 5000;

  /// Binds `path` (a stale socket file left by a dead server is replaced; a live one or any
  /// other file is FAILED_PRECONDITION), sets its mode and group (`group` -1: unchanged) and
  /// starts accepting. `tickets` is borrowed and must outlive the socket.
  static absl::StatusOr<std::unique_ptr<RegionSocket>> Start(const std::string& path, mode_t mode,
                                                             gid_t group, RegionTickets* tickets);
  /// Stops accepting, waits for the connections being served, removes the socket file.
  ~RegionSocket();

  const std::string& path() const { return path_; }

 private:
  RegionSocket(std::string path, int listen_fd, int stop_fd, RegionTickets* tickets);
  void AcceptLoop();
  void Serve(int connection);

  const std::string path_;
  const int listen_fd_;
  const int stop_fd_;  // an eventfd: readable once the socket stops
  RegionTickets* const tickets_;
  // Connections being served. Shared with their threads, which touch only this after they
  // have served, so that the destructor's wait never races their last unlock.
  struct Serving {
    absl::Mutex mu;
    int count ABSL_GUARDED_BY(mu) = 0;
  };
  const std::shared_ptr<Serving> serving_ = std::make_shared<Serving>();
  std::thread acceptor_;
};

/// Prepares `path` for a listening Unix socket: absent is fine; a socket nobody listens on
/// (a server that died) is removed; a live socket or another kind of file is
/// FAILED_PRECONDITION naming `flag`.
absl::Status ClearStaleSocket(const std::string& path, absl::string_view flag);

/// Sets a socket file's mode and group (`group` -1: unchanged); FAILED_PRECONDITION naming
/// `flag` when that fails.
absl::Status SetSocketAccess(const std::string& path, mode_t mode, gid_t group,
                             absl::string_view flag);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_REGION_SOCKET_H_
