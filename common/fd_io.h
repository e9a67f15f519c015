#ifndef TESSERA_COMMON_FD_IO_H_
#define TESSERA_COMMON_FD_IO_H_

// Whole-file reads and writes on a blocking file descriptor, retried on EINTR. Header-only, so
// the small helper programs (tessera-kernel-compiler, the fake driver's compiler) share them
// with the server without linking its libraries.
#include <cerrno>
#include <string>

#include <unistd.h>

namespace tessera {

/// Appends everything up to end of file to `out`; false on a read error (errno set).
inline bool ReadAll(int fd, std::string* out) {
  char buffer[65536];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    out->append(buffer, static_cast<size_t>(n));
  }
}

/// Writes all of `data`; false on a write error (errno set).
inline bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_FD_IO_H_
