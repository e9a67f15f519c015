#include "server/common/systemd.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "spdlog/spdlog.h"

namespace tessera {

void NotifyServiceManager(std::string_view state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const size_t length = std::strlen(path);
  if ((path[0] != '/' && path[0] != '@') || length >= sizeof(address.sun_path)) {
    spdlog::warn("NOTIFY_SOCKET={} is not a socket path; not notifying the service manager", path);
    return;
  }
  std::memcpy(address.sun_path, path, length);
  if (path[0] == '@') address.sun_path[0] = '\0';  // abstract namespace
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    spdlog::warn("notifying the service manager: socket: {}", std::strerror(errno));
    return;
  }
  const auto size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length);
  if (sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&address),
             size) < 0) {
    spdlog::warn("notifying the service manager at {}: {}", path, std::strerror(errno));
  }
  close(fd);
}

}  // namespace tessera
