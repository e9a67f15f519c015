#include "server/common/shared_memory.h"

#include <cerrno>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// Closes the descriptor on every path out of Map.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

absl::Status Refuse(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("the descriptor ", why));
}

// What the descriptor refers to, for people ("a pipe", "a regular file").
std::string Kind(const struct stat& st) {
  if (S_ISFIFO(st.st_mode)) return "a pipe";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISDIR(st.st_mode)) return "a directory";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Map(int fd, uint64_t size) {
  FdCloser closer(fd);
  if (fd < 0) return Refuse("is missing");
  if (size == 0 || size > kMaxRegionSizeBytes) {
    return absl::InvalidArgumentError(absl::StrCat("size_bytes is ", size, "; the range is 1..",
                                                   kMaxRegionSizeBytes, " (1 TiB)"));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) return Refuse(absl::StrCat("cannot be examined: ", strerror(errno)));
  if (!S_ISREG(st.st_mode)) {
    return Refuse(absl::StrCat("is ", Kind(st), ", not a memfd (memfd_create)"));
  }
  // A memfd's link in /proc names it "/memfd:NAME (deleted)"; a file on tmpfs or a disk
  // names its path. Only memfds are accepted: a named file could be reached by others.
  char link[128] = {};
  const std::string self = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(self.c_str(), link, sizeof(link) - 1);
  if (n <= 0 || !absl::StartsWith(absl::string_view(link, static_cast<size_t>(n)), "/memfd:")) {
    return Refuse("is a file with a name, not a memfd (memfd_create)");
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return Refuse("is not a memfd that supports seals (MFD_ALLOW_SEALING)");
  if ((seals & F_SEAL_SHRINK) == 0) {
    return Refuse(
        "is not sealed against shrinking: create the memfd with MFD_ALLOW_SEALING, size it, "
        "then fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return Refuse("is sealed against writes; regions are written by downloads");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return Refuse("is not open for reading and writing (O_RDWR)");
  }
  if (static_cast<uint64_t>(st.st_size) < size) {
    return Refuse(absl::StrCat("holds ", st.st_size, " bytes; the ticket is for ", size,
                               " (ftruncate the memfd before sealing it)"));
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    if (error == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot map ", size, " bytes: the server is out of address space"));
    }
    return Refuse(absl::StrCat("cannot be mapped: ", strerror(error)));
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory(static_cast<char*>(data), size));
}

SharedMemory::~SharedMemory() { munmap(data_, size_); }

}  // namespace tessera
