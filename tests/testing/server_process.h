#ifndef TESSERA_TESTS_TESTING_SERVER_PROCESS_H_
#define TESSERA_TESTS_TESTING_SERVER_PROCESS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "tests/testing/sizes.h"

namespace tessera::testing {

/// Path of the tessera-server binary under test (set by CMake).
const char* ServerBinary();
/// Path of the tessera CLI under test (set by CMake).
const char* CliBinary();

/// A real tessera-server process on an ephemeral 127.0.0.1 port, with its stdout and stderr
/// captured. Killed (SIGKILL) on destruction unless already stopped.
class ServerProcess {
 public:
  struct Options {
    /// Required for tessera-server: the --state_dir.
    std::string state_dir;
    /// Another program speaking the same banner ("listening on 127.0.0.1:PORT"), run with
    /// `args` only (no --listen/--state_dir); empty for tessera-server. Benchmarks use it
    /// to run their transport baselines in a process of their own, like the server.
    std::string binary;
    /// Extra flags, e.g. "--cpu_memory_bytes=1GiB".
    std::vector<std::string> args;
    /// Extra environment variables.
    std::map<std::string, std::string> env;
    absl::Duration start_timeout = absl::Seconds(30);
  };

  /// Starts the server and waits until it prints its "listening on" banner. The error
  /// carries the process output when it exits or times out instead.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(Options options);
  ~ServerProcess();

  int port() const { return port_; }
  std::string address() const;
  pid_t pid() const { return pid_; }
  /// The admin token from <state_dir>/admin.token.
  std::string AdminToken() const;

  /// Sends `signal` and waits for the exit; returns the exit code (128+N when killed by N).
  absl::StatusOr<int> Stop(int signal, absl::Duration timeout = absl::Seconds(30));
  /// Waits for the process to exit on its own; returns the exit code (128+N when killed by
  /// N). DEADLINE_EXCEEDED (and the process killed) when it is still running after `timeout`.
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);
  /// Everything the process printed so far.
  std::string output() const ABSL_LOCKS_EXCLUDED(mu_);
  /// Waits until the output contains `text`.
  bool WaitForOutput(const std::string& text, absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ServerProcess(Options options, pid_t pid, int read_fd);
  void ReadLoop();
  void WaitForEof(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const pid_t pid_;
  const int read_fd_;
  int port_ = 0;
  bool exited_ = false;
  mutable absl::Mutex mu_;
  std::string output_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

/// Device memory that every backend under test offers: 8 GiB.
inline constexpr uint64_t kTestDeviceMemoryBytes = 8 * kGiB;

/// The backend that the integration suite runs its servers on, from $TESSERA_TEST_BACKEND:
/// "cpu" (the default) or "cuda" (the CUDA module; in CI on the fake driver, which ctest puts
/// first on LD_LIBRARY_PATH). tests/CMakeLists.txt registers the suite once per backend, so
/// tests take their server's flags from here (OnTestBackend) and never name a backend.
struct TestBackend {
  /// The backend's name as GetServerInfo reports it and --backend takes it.
  std::string name;
  /// Flags selecting it with kTestDeviceMemoryBytes of device memory. Any other value of
  /// $TESSERA_TEST_BACKEND is passed on as --backend, which the server refuses clearly.
  std::vector<std::string> args;
  /// Environment the server needs for it.
  std::map<std::string, std::string> env;
};
/// Read once; thread-safe.
const TestBackend& BackendUnderTest();

/// A free loopback port (bound, read, released; a server binds it right after), below the
/// kernel's ephemeral range when there is room, where outgoing connections do not take it.
int FreePort();
/// `options` on the backend under test: its flags go first (flags in `options.args` come
/// later and win) and its environment is added (entries in `options.env` win).
ServerProcess::Options OnTestBackend(ServerProcess::Options options);

/// Starts argv[0] (a path) with this process's environment plus `extra_env` (which wins),
/// stdin from `stdin_fd` (/dev/null when -1) and stdout and stderr into `output_fd`; the
/// child is killed when this process dies (PR_SET_PDEATHSIG). The caller keeps its fds and
/// reaps the child.
absl::StatusOr<pid_t> StartProcess(const std::vector<std::string>& argv,
                                   const std::map<std::string, std::string>& extra_env,
                                   int stdin_fd, int output_fd);

/// Runs a command to completion (bounded by `timeout`), returning its exit code and output.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         const std::map<std::string, std::string>& env,
                                         absl::Duration timeout = absl::Seconds(60));

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_SERVER_PROCESS_H_
