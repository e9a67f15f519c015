#include "server/service/region_socket.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

#include "server/common/status_macros.h"
#include "server/core/region_tickets.h"

namespace tessera {
namespace {

// The longest ticket line accepted ("rt_" + 43 base64url characters + "\n" is 47 bytes).
constexpr size_t kMaxLine = 256;
// Descriptors one message may carry before it is refused (all received ones are closed).
constexpr size_t kMaxDescriptors = 8;

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path, absl::string_view flag) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": a socket path is 1..",
                                                   sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

void SendLine(int fd, const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = send(fd, line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away: nothing to tell
    done += static_cast<size_t>(n);
  }
}

std::string Reply(const absl::Status& status) {
  if (status.ok()) return "OK\n";
  std::string message(status.message());
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return absl::StrCat("ERR ", absl::StatusCodeToString(status.code()), " ", message, "\n");
}

}  // namespace

absl::Status ClearStaleSocket(const std::string& path, absl::string_view flag) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", path, ": cannot examine it: ", strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", path,
                     ": the path exists and is not a socket; remove it or "
                     "choose another path"));
  }
  ASSIGN_OR_RETURN(sockaddr_un address, UnixAddress(path, flag));
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  const int connected =
      connect(probe, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int error = errno;
  close(probe);
  if (connected == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, "=", path, ": another server is listening on it (another tessera-server?)"));
  }
  if (error != ECONNREFUSED) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", path, ": cannot tell whether it is in use: ", strerror(error)));
  }
  // Nobody listens: a socket file left by a server that did not remove it (killed).
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", path, ": cannot remove the stale socket: ", strerror(errno)));
  }
  spdlog::info("{}: removed the stale socket file {}", std::string(flag), path);
  return absl::OkStatus();
}

absl::Status SetSocketAccess(const std::string& path, mode_t mode, gid_t group,
                             absl::string_view flag) {
  if (group != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, "=", path, ": cannot give the socket group ", group, ": ", strerror(errno)));
  }
  if (chmod(path.c_str(), mode) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", path, ": cannot set the socket's mode: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RegionSocket>> RegionSocket::Start(const std::string& path,
                                                                  mode_t mode, gid_t group,
                                                                  RegionTickets* tickets) {
  constexpr absl::string_view kFlag = "--unix_socket (descriptor socket)";
  RETURN_IF_ERROR(ClearStaleSocket(path, kFlag));
  ASSIGN_OR_RETURN(sockaddr_un address, UnixAddress(path, kFlag));
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  // Created owner-only; the mode asked for is set once the group is.
  const mode_t old_mask = umask(0177);
  const int bound = bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int bind_error = errno;
  umask(old_mask);
  if (bound != 0 || listen(fd, 64) != 0) {
    const int error = bound != 0 ? bind_error : errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat(kFlag, ": cannot listen on ", path, ": ", strerror(error)));
  }
  if (absl::Status access = SetSocketAccess(path, mode, group, kFlag); !access.ok()) {
    close(fd);
    unlink(path.c_str());
    return access;
  }
  const int stop = eventfd(0, EFD_CLOEXEC);
  if (stop < 0) {
    close(fd);
    unlink(path.c_str());
    return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  }
  std::unique_ptr<RegionSocket> socket(new RegionSocket(path, fd, stop, tickets));
  socket->acceptor_ = std::thread([s = socket.get()] { s->AcceptLoop(); });
  return socket;
}

RegionSocket::RegionSocket(std::string path, int listen_fd, int stop_fd, RegionTickets* tickets)
    : path_(std::move(path)), listen_fd_(listen_fd), stop_fd_(stop_fd), tickets_(tickets) {}

RegionSocket::~RegionSocket() {
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  {
    absl::MutexLock lock(&serving_->mu);
    serving_->mu.Await(absl::Condition(
        +[](int* count) { return *count == 0; }, &serving_->count));
  }
  close(listen_fd_);
  close(stop_fd_);
  unlink(path_.c_str());
}

void RegionSocket::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("descriptor socket {}: poll: {}", path_, strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;  // EINTR, ECONNABORTED, EMFILE: try again
    bool admitted = false;
    {
      absl::MutexLock lock(&serving_->mu);
      if (serving_->count < kMaxConnections) {
        serving_->count++;
        admitted = true;
      }
    }
    if (!admitted) {
      SendLine(
          connection,
          Reply(absl::ResourceExhaustedError(absl::StrCat(
              "the descriptor socket serves ", kMaxConnections, " connections at once; retry"))));
      close(connection);
      continue;
    }
    std::thread([this, connection, serving = serving_] {
      Serve(connection);
      close(connection);
      absl::MutexLock lock(&serving->mu);
      serving->count--;
    }).detach();
  }
}

void RegionSocket::Serve(int connection) {
  timeval timeout{kReceiveTimeoutMs / 1000, (kReceiveTimeoutMs % 1000) * 1000};
  setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string line;
  std::vector<int> received;
  bool truncated = false;
  while (line.size() < kMaxLine && line.find('\n') == std::string::npos) {
    char data[kMaxLine];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxDescriptors)];
    iovec iov{data, kMaxLine - line.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(connection, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of stream, timeout or error
    truncated |= (msg.msg_flags & MSG_CTRUNC) != 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        received.push_back(fd);
      }
    }
    line.append(data, static_cast<size_t>(n));
  }
  const size_t newline = line.find('\n');
  absl::Status status;
  if (newline == std::string::npos) {
    status = absl::InvalidArgumentError(
        absl::StrCat("send the ticket and a newline (at most ", kMaxLine,
                     " bytes) with the descriptor, within ", kReceiveTimeoutMs, " ms"));
  } else if (truncated || received.size() != 1) {
    status = absl::InvalidArgumentError(
        absl::StrCat("send exactly one descriptor (SCM_RIGHTS) with the ticket; ",
                     truncated ? "more than " : "", received.size(), " arrived"));
  }
  if (!status.ok()) {
    for (int fd : received) close(fd);
  } else {
    status = tickets_->Deliver(absl::string_view(line.data(), newline), received.front());
  }
  if (!status.ok()) {
    spdlog::info("descriptor socket: refused a descriptor: {}", status.ToString());
  }
  SendLine(connection, Reply(status));
}

}  // namespace tessera
