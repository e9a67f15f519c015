#include "tests/testing/server_process.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <regex>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace tessera::testing {
namespace {

// Starts argv[0] with stdout+stderr on a pipe; returns the pid and the read end.
absl::Status Spawn(const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& extra_env, pid_t* pid, int* read_fd) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  absl::StatusOr<pid_t> child = StartProcess(argv, extra_env, -1, fds[1]);
  close(fds[1]);
  if (!child.ok()) {
    close(fds[0]);
    return child.status();
  }
  *pid = *child;
  *read_fd = fds[0];
  return absl::OkStatus();
}

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Waits for `pid` until `deadline`; nullopt on timeout.
std::optional<int> WaitUntil(pid_t pid, absl::Time deadline) {
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return DecodeWaitStatus(status);
    if (r < 0 && errno != EINTR) return -1;
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace

absl::StatusOr<pid_t> StartProcess(const std::vector<std::string>& argv,
                                   const std::map<std::string, std::string>& extra_env,
                                   int stdin_fd, int output_fd) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : extra_env) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (std::string& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);
  const int in = stdin_fd >= 0 ? stdin_fd : open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (in < 0) return absl::InternalError("cannot open /dev/null");
  const pid_t child = fork();
  if (child == 0) {
    // Only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(in, 0);
    dup2(output_fd, 1);
    dup2(output_fd, 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argp[0], argp.data(), envp.data());
    _exit(127);
  }
  if (in != stdin_fd) close(in);
  if (child < 0) return absl::InternalError("fork failed");
  return child;
}

const char* ServerBinary() { return TESSERA_SERVER_BIN; }
const char* CliBinary() { return TESSERA_CLI_BIN; }

namespace {

// Binds `port` on 127.0.0.1 (0: any) and releases it: the port bound, or 0.
int BindLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  int bound = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = ntohs(addr.sin_port);
  }
  close(fd);
  return bound;
}

}  // namespace

int FreePort() {
  // Below the kernel's ephemeral range: every outgoing connection (the tests make thousands)
  // takes its local port from that range, so a port found free there can be taken before the
  // server binds it, which failed a test with "Address already in use". Below it, only
  // another test's pick can collide, and picks are random over some 20,000 ports.
  int ephemeral_low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) {
    range >> ephemeral_low;
  }
  const int low = 10000;
  if (ephemeral_low - low >= 1000) {
    thread_local absl::BitGen gen;
    for (int attempt = 0; attempt < 100; ++attempt) {
      const int port = absl::Uniform(gen, low, ephemeral_low);
      if (BindLoopback(port) == port) return port;
    }
  }
  return BindLoopback(0);
}

const TestBackend& BackendUnderTest() {
  static const TestBackend* const backend = [] {
    const char* env = std::getenv("TESSERA_TEST_BACKEND");
    const std::string name = env == nullptr || *env == '\0' ? "cpu" : env;
    // Every server of the suite checks its lock order: a potential deadlock aborts it.
    auto* b = new TestBackend{
        .name = name, .args = {absl::StrCat("--backend=", name), "--deadlock_detection=abort"}};
    if (name == "cpu") {
      b->args.push_back(absl::StrCat("--cpu_memory_bytes=", kTestDeviceMemoryBytes));
    } else if (name == "cuda") {
      // The fake driver's device size (a real GPU has its own and ignores this).
      b->env["TESSERA_FAKE_CUDA_MEMORY_MIB"] = absl::StrCat(kTestDeviceMemoryBytes >> 20);
    }
    return b;
  }();
  return *backend;
}

ServerProcess::Options OnTestBackend(ServerProcess::Options options) {
  const TestBackend& backend = BackendUnderTest();
  options.args.insert(options.args.begin(), backend.args.begin(), backend.args.end());
  options.env.insert(backend.env.begin(), backend.env.end());  // keeps the test's entries
  return options;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(Options options) {
  std::vector<std::string> argv;
  if (options.binary.empty()) {
    argv = {ServerBinary(), "--listen=127.0.0.1:0",
            absl::StrCat("--state_dir=", options.state_dir)};
  } else {
    argv = {options.binary};
  }
  argv.insert(argv.end(), options.args.begin(), options.args.end());
  pid_t pid = 0;
  int fd = -1;
  if (absl::Status s = Spawn(argv, options.env, &pid, &fd); !s.ok()) return s;
  absl::Duration timeout = options.start_timeout;
  std::unique_ptr<ServerProcess> server(new ServerProcess(std::move(options), pid, fd));

  static const std::regex kBanner(R"(listening on 127\.0\.0\.1:(\d+))");
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::string out = server->output();
    std::smatch match;
    if (std::regex_search(out, match, kBanner)) {
      server->port_ = std::stoi(match[1]);
      return server;
    }
    if (std::optional<int> code = WaitUntil(pid, absl::Now()); code.has_value()) {
      server->exited_ = true;
      server->WaitForEof(absl::Seconds(2));  // collect the last words
      return absl::FailedPreconditionError(absl::StrCat("tessera-server exited with ", *code,
                                                        " before serving:\n", server->output()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("tessera-server did not start in time:\n", out));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

ServerProcess::ServerProcess(Options options, pid_t pid, int read_fd)
    : options_(std::move(options)), pid_(pid), read_fd_(read_fd), reader_([this] { ReadLoop(); }) {}

ServerProcess::~ServerProcess() {
  if (!exited_) {
    kill(pid_, SIGKILL);
    WaitUntil(pid_, absl::Now() + absl::Seconds(10));
  }
  reader_.join();
  close(read_fd_);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // In a sanitizer build the server is instrumented too, and its reports go to the output
  // that nobody else reads (a report that does not end the process, a race or undefined
  // behaviour, would pass unseen): the test that ran it fails, showing the report.
  absl::MutexLock lock(&mu_);
  for (const char* marker : {"WARNING: ThreadSanitizer:", "ERROR: AddressSanitizer",
                             "ERROR: LeakSanitizer", ": runtime error: "}) {
    if (size_t at = output_.find(marker); at != std::string::npos) {
      ADD_FAILURE() << "tessera-server (pid " << pid_ << ") reported:\n"
                    << output_.substr(at > 200 ? at - 200 : 0, 12000);
      break;
    }
  }
#endif
}

void ServerProcess::ReadLoop() {
  char buffer[4096];
  for (;;) {
    ssize_t n = read(read_fd_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    absl::MutexLock lock(&mu_);
    if (n <= 0) {
      eof_ = true;
      return;
    }
    output_.append(buffer, static_cast<size_t>(n));
  }
}

std::string ServerProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

std::string ServerProcess::AdminToken() const {
  std::ifstream in(options_.state_dir + "/admin.token");
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

absl::StatusOr<int> ServerProcess::Stop(int signal, absl::Duration timeout) {
  if (exited_) return absl::FailedPreconditionError("already stopped");
  kill(pid_, signal);
  return WaitForExit(timeout);
}

absl::StatusOr<int> ServerProcess::WaitForExit(absl::Duration timeout) {
  if (exited_) return absl::FailedPreconditionError("already stopped");
  std::optional<int> code = WaitUntil(pid_, absl::Now() + timeout);
  if (!code.has_value()) {
    kill(pid_, SIGKILL);
    WaitUntil(pid_, absl::Now() + absl::Seconds(10));
    exited_ = true;
    return absl::DeadlineExceededError(
        absl::StrCat("tessera-server did not exit within ", absl::FormatDuration(timeout)));
  }
  exited_ = true;
  return *code;
}

std::string ServerProcess::output() const {
  absl::MutexLock lock(&mu_);
  return output_;
}

bool ServerProcess::WaitForOutput(const std::string& text, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto found = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return eof_ || output_.find(text) != std::string::npos;
  };
  absl::Time deadline = absl::Now() + timeout;
  while (!found() && absl::Now() < deadline) {
    mu_.AwaitWithDeadline(absl::Condition(&found), deadline);
  }
  return output_.find(text) != std::string::npos;
}

void ServerProcess::WaitForEof(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&eof_), timeout);
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         const std::map<std::string, std::string>& env,
                                         absl::Duration timeout) {
  pid_t pid = 0;
  int fd = -1;
  if (absl::Status s = Spawn(argv, env, &pid, &fd); !s.ok()) return s;
  CommandResult result;
  absl::Time deadline = absl::Now() + timeout;
  char buffer[4096];
  for (;;) {
    int wait_ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (wait_ms <= 0) break;
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  std::optional<int> code = WaitUntil(pid, deadline);
  if (!code.has_value()) {
    kill(pid, SIGKILL);
    WaitUntil(pid, absl::Now() + absl::Seconds(10));
    return absl::DeadlineExceededError(absl::StrCat(
        argv[0], " did not finish within ", absl::FormatDuration(timeout), ":\n", result.output));
  }
  result.exit_code = *code;
  return result;
}

}  // namespace tessera::testing
