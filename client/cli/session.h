// What a running `tessera` command uses: the client, the output format, error reporting with
// the documented exit statuses, stdin/stdout for "-" and the progress bar. One per process,
// used from the main thread only.
#ifndef TESSERA_CLIENT_CLI_SESSION_H_
#define TESSERA_CLIENT_CLI_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

#include "client/cli/command_tree.h"
#include "tessera/client.h"

namespace tessera::cli {

class Session {
 public:
  /// `command` is the command's path ("tenant register"), for messages.
  Session(GlobalFlags flags, std::string command);

  /// Makes the client from the global flags (no connection is made until the first call).
  /// On an unreadable token file or TLS file prints the error and returns kExitUsage.
  int Connect();
  /// The client; Connect() succeeded before.
  Client& client() { return *client_; }

  bool json() const { return flags_.output == "json"; }
  const std::string& command() const { return command_; }

  /// Prints "tessera COMMAND: message" and a pointer to the command's help; kExitUsage.
  int Usage(absl::string_view message) const;
  /// Reports a failed call: kExitUnreachable when no connection to the server was made
  /// (UNAVAILABLE or DEADLINE_EXCEEDED while the channel is not connected), else the
  /// server's code and message and kExitRefused. `hint`, when not empty, is printed after.
  int Failed(const absl::Status& status, absl::string_view hint = "") const;
  /// Prints "tessera COMMAND: message" for a local failure after the request (an output
  /// that could not be written); kExitRefused.
  int LocalFailure(absl::string_view message) const;

  /// The message as protobuf JSON (field names as in the .proto, every field), on stdout.
  void PrintJson(const google::protobuf::Message& message) const;

  /// A progress callback that draws a bar with rate and ETA on stderr, or nullptr when stderr
  /// is not a terminal or `total` is at most 4 MiB.
  Client::Progress ProgressBar(const std::string& label, uint64_t total) const;

  /// A file descriptor to read `path` from ("-": stdin, which must not be a terminal and may
  /// be claimed once: `what` names the claimant). The caller closes it unless it is 0.
  absl::StatusOr<int> OpenInput(const std::string& path, absl::string_view what);

 private:
  absl::StatusOr<std::string> ResolveToken();

  const GlobalFlags flags_;
  const std::string command_;
  std::string address_;
  std::string stdin_claimed_by_;
  std::unique_ptr<Client> client_;
};

/// Where a command writes its binary output: stdout for "-" (which must not be a terminal); an
/// existing device or FIFO as it is; else a temporary file next to `path` that Commit() renames
/// over it, so a failed download leaves an existing file as it was. Abandoned (the temporary
/// file removed) unless committed.
class OutputFile {
 public:
  /// INVALID_ARGUMENT when stdout is a terminal, `path` is a directory or cannot be written.
  static absl::StatusOr<std::unique_ptr<OutputFile>> Open(const std::string& path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  int fd() const { return fd_; }
  /// "stdout" or the path.
  const std::string& name() const { return name_; }
  /// Closes the file and renames it into place (closes a device; nothing for stdout).
  absl::Status Commit();

 private:
  OutputFile(int fd, std::string path, std::string temp, bool owned);

  const int fd_;
  const std::string path_;
  const std::string temp_;  // "" for stdout and devices
  const std::string name_;
  const bool owned_;  // closed here (not stdout)
  bool committed_ = false;
};

/// "stdin" for "-", else the path.
std::string DisplayName(const std::string& path);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_SESSION_H_
