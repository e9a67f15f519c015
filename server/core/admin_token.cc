#include "server/core/admin_token.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "common/fd_io.h"

namespace tessera {
namespace {

absl::Status CheckLength(absl::string_view token, absl::string_view source) {
  if (token.size() < kMinAdminTokenLength) {
    return absl::FailedPreconditionError(absl::StrCat("admin token from ", source, " is ",
                                                      token.size(), " characters; at least ",
                                                      kMinAdminTokenLength, " are required"));
  }
  return absl::OkStatus();
}

absl::Status SystemError(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot ", what, " admin token file ", path, ": ", std::strerror(errno)));
}

// Creates `path` holding `token` so that a crash at any point leaves either no file or the whole
// token, never an empty or partial one: the token goes to a temporary file in the same directory,
// is synced, and is then linked to `path` (link, unlike rename, fails if `path` appeared
// meanwhile, so a token another process created first is never replaced); the directory is
// synced last so that the new name survives a power loss. Returns AlreadyExists when `path`
// exists.
absl::Status WriteNewToken(const std::string& path, const std::string& token) {
  std::string temp = absl::StrCat(path, ".tmp.XXXXXX");
  int fd = mkostemp(temp.data(), O_CLOEXEC);  // mode 0600, a name no other caller has
  if (fd < 0) return SystemError("create", temp);
  absl::Cleanup remove_temp = [&temp] { unlink(temp.c_str()); };
  {
    absl::Cleanup close_fd = [fd] { close(fd); };
    if (!WriteAll(fd, token + "\n")) return SystemError("write", temp);
    if (fsync(fd) != 0) return SystemError("sync", temp);
  }
  if (link(temp.c_str(), path.c_str()) != 0) {
    if (errno == EEXIST) return absl::AlreadyExistsError(path);
    return SystemError("create", path);
  }
  std::string dir = path;
  const size_t slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return SystemError("open the directory of", path);
  absl::Cleanup close_dir = [dir_fd] { close(dir_fd); };
  std::move(remove_temp).Invoke();
  if (fsync(dir_fd) != 0) return SystemError("sync the directory of", path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AdminCredential> LoadOrCreateAdminToken(const std::string& path,
                                                       const std::string& env_value) {
  AdminCredential credential;
  if (!env_value.empty()) {
    std::string token(absl::StripAsciiWhitespace(env_value));
    credential.source = "$TESSERA_ADMIN_TOKEN";
    if (absl::Status s = CheckLength(token, credential.source); !s.ok()) return s;
    credential.hash = HashCredential(token);
    return credential;
  }
  credential.source = path;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return SystemError("stat", path);
    absl::StatusOr<std::string> token = RandomToken(kSecretBytes);
    if (!token.ok()) return token.status();
    absl::Status written = WriteNewToken(path, *token);
    if (written.ok()) {
      credential.hash = HashCredential(*token);
      credential.created = true;
      return credential;
    }
    // Another process created the file first: use its token.
    if (!absl::IsAlreadyExists(written)) return written;
    if (stat(path.c_str(), &st) != 0) return SystemError("stat", path);
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    credential.warning =
        absl::StrFormat("admin token file %s has mode %04o: readable by others; chmod 600 it", path,
                        st.st_mode & 07777);
  }
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read admin token file ", path));
  }
  std::string token(absl::StripAsciiWhitespace(line));
  if (absl::Status s = CheckLength(token, path); !s.ok()) return s;
  credential.hash = HashCredential(token);
  return credential;
}

}  // namespace tessera
