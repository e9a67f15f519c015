// The `tessera` CLI's commands, flags, help and exit statuses, on CLI11 (Debian's
// libcli11-dev, header-only). Each command declares its own flags and arguments, so a flag
// that does not apply to a command is a usage error, and each has a help page with examples.
// CLI11 reports parse errors as exceptions; they are caught in CommandTree::Parse and never
// leave it.
#ifndef TESSERA_CLIENT_CLI_COMMAND_TREE_H_
#define TESSERA_CLIENT_CLI_COMMAND_TREE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace CLI {
class App;
class Option;
class ParseError;
class Validator;
}  // namespace CLI

namespace tessera::cli {

/// The exit statuses (also in `tessera --help`, README.md and docs/cli.md).
enum ExitCode : int {
  /// The command did what it says.
  kExitOk = 0,
  /// The server refused the request (any gRPC error from a server that was reached), a job
  /// failed, or the output could not be written.
  kExitRefused = 1,
  /// The command line is wrong: unknown command or flag, a flag the command does not take,
  /// a bad value, a missing argument or required flag, an unreadable input file. Nothing was
  /// sent to the server.
  kExitUsage = 2,
  /// The server could not be reached: connection refused, unknown host, TLS handshake
  /// failure, or the deadline passed before a connection was made.
  kExitUnreachable = 3,
};

/// Flags every command takes (before or after the command's name).
struct GlobalFlags {
  std::string addr;  // "": $TESSERA_ADDR, else 127.0.0.1:50051
  std::string token;
  std::string token_file;  // "-": stdin
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  absl::Duration timeout = absl::Seconds(30);
  std::string output = "text";  // "text" or "json"
};

class Session;
/// Runs a command; returns its exit status. Called once, after parsing succeeded.
using Handler = std::function<int(Session&)>;

/// A command's help page, beyond its flags' own descriptions.
struct CommandDoc {
  /// What follows the command's name in its usage line: "ID --memory=SIZE [FLAGS]".
  std::string usage;
  /// Paragraphs shown under the one-line summary; may be empty.
  std::string details;
  /// Whole command lines, one per example.
  std::vector<std::string> examples;
  /// Runs without a server (help, completion): no client is made.
  bool local = false;
};

/// The command tree. Built once by main (single-threaded); the flag values it binds live as
/// long as it does.
class CommandTree {
 public:
  CommandTree();
  ~CommandTree();
  CommandTree(const CommandTree&) = delete;
  CommandTree& operator=(const CommandTree&) = delete;

  /// A group of commands ("tenant"), under the root or another group; `section` places it in
  /// `tessera --help` (groups only).
  CLI::App* Group(CLI::App* parent, const std::string& name, const std::string& summary,
                  const std::string& section = "");
  /// A command that runs `handler` ("tenant register"). Declare its flags on the result.
  CLI::App* Command(CLI::App* parent, const std::string& name, const std::string& summary,
                    CommandDoc doc, Handler handler, const std::string& section = "");
  CLI::App* root() { return root_.get(); }
  /// `help [COMMAND...]` and `completion bash`: added last, so they are listed last.
  void AddHelpCommands();

  /// Storage for a command's flag values, owned by the tree.
  template <typename T>
  T* Make() {
    auto owned = std::make_shared<T>();
    storage_.push_back(owned);
    return owned.get();
  }

  /// The outcome of Parse: the command to run (with its path, "tenant register") or the exit
  /// status to end with (help, version, usage error: already printed).
  struct Parsed {
    const Handler* handler = nullptr;
    std::string command;
    bool needs_server = true;
    int exit_code = kExitOk;
  };
  Parsed Parse(int argc, char** argv);
  const GlobalFlags& global() const { return global_; }

  /// The help page of the command at `path` ({} for the root), as `tessera help PATH...`
  /// prints it; "" for an unknown path.
  std::string Help(const std::vector<std::string>& path) const;
  /// A bash completion script for every command and flag.
  std::string BashCompletion() const;

 private:
  std::string HelpFor(const CLI::App* app) const;
  std::string RootHelp() const;
  std::string CommandPath(const CLI::App* app) const;
  void PlaceInSection(const CLI::App* app, const std::string& section);
  /// The commands ("tenant register") that have a flag named `name` ("memory").
  std::vector<std::string> CommandsWithFlag(const std::string& name) const;
  /// A usage error in words: an unknown or inapplicable flag, an unknown command, a missing
  /// one, an extra argument; else CLI11's message. `at`: the deepest command parsed.
  std::string ExplainParseError(const CLI::ParseError& error, const CLI::App* at) const;
  const CLI::App* Deepest() const;
  int UsageError(const CLI::App* app, const std::string& message) const;

  std::unique_ptr<CLI::App> root_;
  CLI::App* help_app_ = nullptr;
  GlobalFlags global_;
  std::string timeout_text_ = "30s";
  std::map<const CLI::App*, CommandDoc> docs_;
  std::map<const CLI::App*, Handler> handlers_;
  std::map<const CLI::App*, std::string> sections_;
  std::vector<std::string> section_order_;
  std::vector<std::shared_ptr<void>> storage_;
};

/// `validator` without its description, which CLI11 would append to the value's name in help
/// ("text|json:{text,json}").
CLI::Validator Quiet(CLI::Validator validator);

/// "tessera 0.1.0 (git 1a2b3c4d5e6f, RelWithDebInfo build)".
std::string VersionLine();

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_COMMAND_TREE_H_
