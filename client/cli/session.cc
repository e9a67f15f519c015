#include "client/cli/session.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"

#include "client/cli/format.h"
#include "common/fd_io.h"

namespace tessera::cli {

std::string DisplayName(const std::string& path) { return path == "-" ? "stdin" : path; }

Session::Session(GlobalFlags flags, std::string command)
    : flags_(std::move(flags)), command_(std::move(command)) {}

absl::StatusOr<std::string> Session::ResolveToken() {
  if (!flags_.token.empty()) return flags_.token;
  if (const std::string& path = flags_.token_file; !path.empty()) {
    absl::StatusOr<int> fd = OpenInput(path, "--token_file");
    if (!fd.ok()) return fd.status();
    std::string text;
    const bool read = ReadAll(*fd, &text);
    if (*fd != 0) close(*fd);
    if (!read) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token_file=", path, ": ", std::strerror(errno)));
    }
    return std::string(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
  }
  if (const char* env = std::getenv("TESSERA_TOKEN")) return std::string(env);
  return std::string();
}

int Session::Connect() {
  ClientOptions options;
  options.address = flags_.addr;
  if (options.address.empty()) {
    const char* env = std::getenv("TESSERA_ADDR");
    options.address = env != nullptr && *env != '\0' ? env : "127.0.0.1:50051";
  }
  address_ = options.address;
  absl::StatusOr<std::string> token = ResolveToken();
  if (!token.ok()) return Usage(token.status().message());
  options.token = *std::move(token);
  options.tls = flags_.tls;
  options.tls_ca_file = flags_.tls_ca;
  options.tls_cert_file = flags_.tls_cert;
  options.tls_key_file = flags_.tls_key;
  options.timeout = flags_.timeout;
  // Over the server's Unix socket, transfers go through a shared-memory region unless turned
  // off here (or per command with --no_regions).
  if (const char* regions = std::getenv("TESSERA_REGIONS"); regions != nullptr) {
    const std::string value = absl::AsciiStrToLower(regions);
    if (value == "off") {
      options.use_regions = false;
    } else if (value != "auto" && !value.empty()) {
      return Usage(absl::StrCat("$TESSERA_REGIONS is \"", regions, "\"; use auto or off"));
    }
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(std::move(options));
  if (!client.ok()) return Usage(client.status().message());
  client_ = *std::move(client);
  return kExitOk;
}

int Session::Usage(absl::string_view message) const {
  std::fprintf(stderr, "tessera %s: %s\nrun `tessera %s --help` for usage\n", command_.c_str(),
               std::string(message).c_str(), command_.c_str());
  return kExitUsage;
}

int Session::Failed(const absl::Status& status, absl::string_view hint) const {
  const bool connected =
      client_ != nullptr && client_->channel()->GetState(false) == GRPC_CHANNEL_READY;
  if ((absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) && !connected) {
    std::fprintf(stderr,
                 "tessera %s: could not reach the server at %s (%s: %s)\n"
                 "is tessera-server running there? the address comes from --addr or "
                 "$TESSERA_ADDR\n",
                 command_.c_str(), address_.c_str(),
                 absl::StatusCodeToString(status.code()).c_str(),
                 std::string(status.message()).c_str());
    return kExitUnreachable;
  }
  std::fprintf(stderr, "tessera %s: %s: %s\n", command_.c_str(),
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  if (!hint.empty()) std::fprintf(stderr, "hint: %s\n", std::string(hint).c_str());
  if (const std::optional<absl::Duration> wait = RetryAfter(status); wait.has_value()) {
    std::fprintf(stderr, "hint: the server asks to retry in %s\n",
                 absl::FormatDuration(*wait).c_str());
  }
  return kExitRefused;
}

int Session::LocalFailure(absl::string_view message) const {
  std::fprintf(stderr, "tessera %s: %s\n", command_.c_str(), std::string(message).c_str());
  return kExitRefused;
}

void Session::PrintJson(const google::protobuf::Message& message) const {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::cout << json;
}

Client::Progress Session::ProgressBar(const std::string& label, uint64_t total) const {
  if (total <= (uint64_t{4} << 20) || !isatty(STDERR_FILENO)) return nullptr;
  const absl::Time start = absl::Now();
  return [label, start, last = absl::InfinitePast()](uint64_t done, uint64_t all) mutable {
    const absl::Time now = absl::Now();
    // At most ten redraws a second, and always the last one.
    if (done < all && now - last < absl::Milliseconds(100)) return;
    last = now;
    std::fprintf(stderr, "\r%s\x1b[K", FormatProgress(label, done, all, now - start).c_str());
    if (done >= all) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

absl::StatusOr<int> Session::OpenInput(const std::string& path, absl::string_view what) {
  if (path == "-") {
    if (!stdin_claimed_by_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " and ", stdin_claimed_by_, " cannot both read stdin"));
    }
    if (isatty(STDIN_FILENO)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": - reads stdin, which is a terminal; pipe the data in or name a file"));
    }
    stdin_claimed_by_ = std::string(what);
    return STDIN_FILENO;
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot read ", path, ": ", std::strerror(errno)));
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<OutputFile>> OutputFile::Open(const std::string& path) {
  if (path == "-") {
    if (isatty(STDOUT_FILENO)) {
      return absl::InvalidArgumentError(
          "-o -: stdout is a terminal; redirect it (> FILE.npy, | python3 ...) or name a file");
    }
    return std::unique_ptr<OutputFile>(new OutputFile(STDOUT_FILENO, path, "", false));
  }
  // A device or a FIFO (-o /dev/null) is written as it is; only a file is replaced.
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("-o: ", path, " is a directory"));
    }
    const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("-o: cannot write ", path, ": ", std::strerror(errno)));
    }
    return std::unique_ptr<OutputFile>(new OutputFile(fd, path, "", true));
  }
  // The kernel applies the umask to 0666, as for any new file.
  const std::string temp = absl::StrCat(path, ".tessera-", getpid(), ".tmp");
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("-o: cannot write ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<OutputFile>(new OutputFile(fd, path, temp, true));
}

OutputFile::OutputFile(int fd, std::string path, std::string temp, bool owned)
    : fd_(fd),
      path_(std::move(path)),
      temp_(std::move(temp)),
      name_(path_ == "-" ? "stdout" : path_),
      owned_(owned) {}

OutputFile::~OutputFile() {
  if (committed_ || !owned_) return;
  close(fd_);
  if (!temp_.empty()) unlink(temp_.c_str());
}

absl::Status OutputFile::Commit() {
  if (committed_ || !owned_) return absl::OkStatus();
  committed_ = true;
  const bool closed = close(fd_) == 0;
  if (closed && (temp_.empty() || rename(temp_.c_str(), path_.c_str()) == 0)) {
    return absl::OkStatus();
  }
  const int error = errno;
  if (!temp_.empty()) unlink(temp_.c_str());
  return absl::UnavailableError(absl::StrCat(path_, ": ", std::strerror(error)));
}

}  // namespace tessera::cli
