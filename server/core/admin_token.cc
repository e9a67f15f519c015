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

absl::Status WriteNewToken(const std::string& path, const std::string& token) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create admin token file ", path, ": ", std::strerror(errno)));
  }
  absl::Cleanup close_fd = [fd] { close(fd); };
  std::string line = token + "\n";
  size_t written = 0;
  while (written < line.size()) {
    ssize_t n = write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      unlink(path.c_str());
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write admin token file ", path, ": ", std::strerror(errno)));
    }
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    unlink(path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot sync admin token file ", path, ": ", std::strerror(errno)));
  }
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
    if (errno != ENOENT) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot stat admin token file ", path, ": ", std::strerror(errno)));
    }
    absl::StatusOr<std::string> token = RandomToken(kSecretBytes);
    if (!token.ok()) return token.status();
    if (absl::Status s = WriteNewToken(path, *token); !s.ok()) return s;
    credential.hash = HashCredential(*token);
    credential.created = true;
    return credential;
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
