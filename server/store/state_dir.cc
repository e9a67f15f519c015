#include "server/store/state_dir.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// Makes `dir`'s entries (a file or directory just created in it) durable; best effort, as
// some file systems refuse fsync on a directory.
void SyncDirectory(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)fsync(fd);
  close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateDir>> StateDir::Open(const std::string& path) {
  std::error_code ec;
  const bool created = std::filesystem::create_directories(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create state directory ", path, ": ", ec.message()));
  }
  if (created) {
    // A new state directory survives a power loss with the first commit inside it.
    std::filesystem::path parent = std::filesystem::absolute(path, ec).parent_path();
    if (!ec) SyncDirectory(parent.string());
  }
  chmod(path.c_str(), 0700);  // best effort: the directory holds credentials
  std::string lock_path = path + "/LOCK";
  int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int error = errno;
    close(fd);
    if (error == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("state directory ", path,
                       " is in use by another tessera-server (its LOCK is held); stop it or pass a "
                       "different --state_dir"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot lock ", lock_path, ": ", std::strerror(error)));
  }
  return std::unique_ptr<StateDir>(new StateDir(path, fd));
}

StateDir::~StateDir() { close(lock_fd_); }  // closing releases the flock

}  // namespace tessera
