#ifndef TESSERA_SERVER_STORE_STATE_DIR_H_
#define TESSERA_SERVER_STORE_STATE_DIR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tessera {

/// The server's state directory, held exclusively: an advisory lock on `<dir>/LOCK` keeps a
/// second server from using the same tenant table. Released on destruction.
class StateDir {
 public:
  /// Creates the directory (mode 0700) when absent and takes the lock. FAILED_PRECONDITION
  /// when another process holds it or the directory cannot be created.
  static absl::StatusOr<std::unique_ptr<StateDir>> Open(const std::string& path);
  ~StateDir();

  StateDir(const StateDir&) = delete;
  StateDir& operator=(const StateDir&) = delete;

  const std::string& path() const { return path_; }
  /// `<dir>/<name>`.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  StateDir(std::string path, int lock_fd) : path_(std::move(path)), lock_fd_(lock_fd) {}

  const std::string path_;
  const int lock_fd_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_STATE_DIR_H_
