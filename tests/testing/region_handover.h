#ifndef TESSERA_TESTS_TESTING_REGION_HANDOVER_H_
#define TESSERA_TESTS_TESTING_REGION_HANDOVER_H_

// The region hand-over of docs/api.md ("Registering a region"), written from the document
// alone with plain system calls, so that tests prove a client in any language can implement
// it, and can send the server every kind of bad descriptor.
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace tessera::testing {

/// A memfd of `size` bytes; `seals` (F_SEAL_*) added when non-zero; -1 on failure.
inline int MakeMemfd(uint64_t size, int seals = F_SEAL_SHRINK, bool allow_sealing = true) {
  const int fd =
      memfd_create("tessera-test", MFD_CLOEXEC | (allow_sealing ? MFD_ALLOW_SEALING : 0));
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

/// Connects to the descriptor socket at `path`, sends `line` with `fds` (SCM_RIGHTS; none
/// when empty), and returns the server's one-line answer ("OK" or "ERR CODE message", without
/// the newline), or "connect: ..." / "send: ..." when that fails. The caller keeps its fds.
inline std::string SendDescriptors(const std::string& path, const std::string& line,
                                   const std::vector<int>& fds) {
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return std::string("socket: ") + strerror(errno);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  if (connect(s, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const std::string error = std::string("connect: ") + strerror(errno);
    close(s);
    return error;
  }
  std::string data = line;
  iovec iov{data.data(), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (fds.empty() ? 1 : fds.size())));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (!data.empty() && sendmsg(s, &msg, MSG_NOSIGNAL) < 0) {
    const std::string error = std::string("send: ") + strerror(errno);
    close(s);
    return error;
  }
  shutdown(s, SHUT_WR);
  std::string reply;
  char buffer[512];
  for (;;) {
    const ssize_t n = read(s, buffer, sizeof(buffer));
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(s);
  while (!reply.empty() && reply.back() == '\n') reply.pop_back();
  return reply;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_REGION_HANDOVER_H_
