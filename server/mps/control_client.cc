#include "server/mps/control_client.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace tessera {
namespace {

// Replies by which the daemon (or its front end) refuses a command it does not know.
bool IsRejection(absl::string_view out) {
  for (absl::string_view prefix : {"Unrecognized", "Unknown", "Invalid", "Error", "error"}) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(out), prefix)) return true;
  }
  return false;
}

void CloseAll(std::initializer_list<int*> fds) {
  for (int* fd : fds) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

// Writes to a pipe whose reader may already have exited, without a process-wide SIGPIPE
// disposition: SIGPIPE is blocked for this thread during the write, and one it raised is
// consumed before unblocking.
void WriteWithoutSigpipe(int fd, const std::string& data) {
  sigset_t pipe_only, previous;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &previous);
  if (write(fd, data.data(), data.size()) < 0 && errno == EPIPE) {
    const timespec no_wait{0, 0};
    sigtimedwait(&pipe_only, nullptr, &no_wait);
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

}  // namespace

std::vector<std::string> EnvironmentWith(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    bool replaced = false;
    for (const auto& [name, value] : overrides) {
      replaced = replaced || absl::StartsWith(*e, absl::StrCat(name, "="));
    }
    if (!replaced) env.emplace_back(*e);
  }
  for (const auto& [name, value] : overrides) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

SpawnAttributes::SpawnAttributes() {
  posix_spawnattr_init(&attributes_);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes_, &none);
  posix_spawnattr_setflags(&attributes_, POSIX_SPAWN_SETSIGMASK);
}

SpawnAttributes::~SpawnAttributes() { posix_spawnattr_destroy(&attributes_); }

absl::string_view MpsServerStateName(MpsServerState state) {
  switch (state) {
    case MpsServerState::kInitializing:
      return "INITIALIZING";
    case MpsServerState::kActive:
      return "ACTIVE";
    case MpsServerState::kFault:
      return "FAULT";
    case MpsServerState::kUnknown:
      break;
  }
  return "UNKNOWN";
}

absl::StatusOr<std::vector<pid_t>> ParsePidList(absl::string_view command, absl::string_view text) {
  std::vector<pid_t> pids;
  for (absl::string_view word :
       absl::StrSplit(text, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty())) {
    int pid = 0;
    if (!absl::SimpleAtoi(word, &pid) || pid <= 0) {
      return absl::InternalError(absl::StrCat("unexpected reply to ", command, ": \"",
                                              absl::StripAsciiWhitespace(text),
                                              "\" (expected process ids)"));
    }
    pids.push_back(static_cast<pid_t>(pid));
  }
  return pids;
}

absl::StatusOr<MpsServerState> ParseServerState(absl::string_view text) {
  absl::string_view word = absl::StripAsciiWhitespace(text);
  if (word == "ACTIVE") return MpsServerState::kActive;
  if (word == "INITIALIZING") return MpsServerState::kInitializing;
  if (word == "FAULT") return MpsServerState::kFault;
  return absl::InternalError(absl::StrCat("unexpected reply to get_server_status: \"", word,
                                          "\" (expected INITIALIZING, ACTIVE or FAULT)"));
}

absl::StatusOr<std::vector<MpsClientProcess>> ParsePs(absl::string_view text) {
  std::vector<MpsClientProcess> clients;
  bool header = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    if (absl::StartsWith(line, "PID")) {
      header = true;
      continue;
    }
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    MpsClientProcess c;
    int pid = 0, server = 0;
    if (f.size() < 5 || !absl::SimpleAtoi(f[0], &pid) || !absl::SimpleAtoi(f[2], &server)) {
      return absl::InternalError(absl::StrCat("unexpected line in the reply to ps: \"", line,
                                              "\" (expected PID ID SERVER DEVICE NAMESPACE "
                                              "COMMAND)"));
    }
    c.pid = pid;
    c.id = std::string(f[1]);
    c.server = server;
    c.device = std::string(f[3]);
    c.pid_namespace = std::string(f[4]);
    // The command line is the rest, spaces included.
    size_t at = line.find(f[4], line.find(f[3]) + f[3].size()) + f[4].size();
    c.command = std::string(absl::StripAsciiWhitespace(line.substr(std::min(at, line.size()))));
    clients.push_back(std::move(c));
  }
  if (!clients.empty() && !header) {
    return absl::InternalError("unexpected reply to ps: no PID header line");
  }
  return clients;
}

absl::StatusOr<double> ParsePercentage(absl::string_view text) {
  double value = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &value) || value < 0 || value > 100) {
    return absl::InternalError(
        absl::StrCat("unexpected percentage \"", absl::StripAsciiWhitespace(text), "\""));
  }
  return value;
}

absl::StatusOr<std::string> MpsControlClient::Run(absl::string_view command) const {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    CloseAll({&in[0], &in[1], &out[0], &out[1], &err[0], &err[1]});
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  std::vector<std::string> env_storage =
      EnvironmentWith({{"CUDA_MPS_PIPE_DIRECTORY", options_.pipe_directory}});
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string binary = options_.binary;
  char* argv[] = {binary.data(), nullptr};
  pid_t pid = -1;
  SpawnAttributes attributes;
  int spawned = posix_spawnp(&pid, binary.c_str(), &actions, attributes.get(), argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  CloseAll({&in[0], &out[1], &err[1]});
  if (spawned != 0) {
    CloseAll({&in[1], &out[0], &err[0]});
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", options_.binary, " (", std::strerror(spawned),
                     "); install the NVIDIA driver's MPS tools or set --mps_control to its path"));
  }
  // The command is a few bytes: the pipe takes it whole. A daemon that never reads it is
  // caught by the deadline below.
  const std::string line = absl::StrCat(command, "\n");
  WriteWithoutSigpipe(in[1], line);
  CloseAll({&in[1]});

  const absl::Time deadline = absl::Now() + options_.timeout;
  std::string stdout_text, stderr_text;
  bool timed_out = false;
  while (out[0] >= 0 || err[0] >= 0) {
    pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (wait_ms <= 0) {
      timed_out = true;
      break;
    }
    int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(wait_ms, 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[4096];
      ssize_t got = read(fds[i].fd, buffer, sizeof(buffer));
      if (got > 0) {
        (i == 0 ? stdout_text : stderr_text).append(buffer, static_cast<size_t>(got));
      } else {
        CloseAll({i == 0 ? &out[0] : &err[0]});
      }
    }
  }
  CloseAll({&out[0], &err[0]});
  int wstatus = 0;
  while (!timed_out) {
    pid_t done = waitpid(pid, &wstatus, WNOHANG);
    if (done == pid) break;
    if (absl::Now() >= deadline) {
      timed_out = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  if (timed_out) {
    kill(pid, SIGKILL);
    waitpid(pid, &wstatus, 0);
    return absl::DeadlineExceededError(
        absl::StrCat(options_.binary, " did not answer \"", command, "\" within ",
                     absl::FormatDuration(options_.timeout), " (pipe directory ",
                     options_.pipe_directory, "); it was killed"));
  }
  const std::string said = std::string(absl::StripAsciiWhitespace(
      stderr_text.empty() ? stdout_text : absl::StrCat(stderr_text, " ", stdout_text)));
  if (WIFSIGNALED(wstatus)) {
    return absl::UnavailableError(absl::StrCat(options_.binary, " died of signal ",
                                               WTERMSIG(wstatus), " running \"", command, "\""));
  }
  if (WEXITSTATUS(wstatus) != 0) {
    return absl::UnavailableError(absl::StrCat(
        options_.binary, " exited with status ", WEXITSTATUS(wstatus), " running \"", command,
        "\" (pipe directory ", options_.pipe_directory, ")", said.empty() ? "" : ": ", said));
  }
  if (IsRejection(stdout_text) || IsRejection(stderr_text)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the MPS control daemon rejected \"", command, "\": ", said));
  }
  return stdout_text;
}

absl::StatusOr<std::vector<pid_t>> MpsControlClient::GetServerList() const {
  absl::StatusOr<std::string> out = Run("get_server_list");
  if (!out.ok()) return out.status();
  return ParsePidList("get_server_list", *out);
}

absl::StatusOr<MpsServerState> MpsControlClient::GetServerStatus(pid_t server) const {
  absl::StatusOr<std::string> out = Run(absl::StrCat("get_server_status ", server));
  if (!out.ok()) return out.status();
  return ParseServerState(*out);
}

absl::StatusOr<std::vector<pid_t>> MpsControlClient::GetClientList(pid_t server) const {
  const std::string command = absl::StrCat("get_client_list ", server);
  absl::StatusOr<std::string> out = Run(command);
  if (!out.ok()) return out.status();
  return ParsePidList(command, *out);
}

absl::StatusOr<std::vector<MpsClientProcess>> MpsControlClient::Ps() const {
  absl::StatusOr<std::string> out = Run("ps");
  if (!out.ok()) return out.status();
  return ParsePs(*out);
}

absl::StatusOr<double> MpsControlClient::GetDefaultActiveThreadPercentage() const {
  absl::StatusOr<std::string> out = Run("get_default_active_thread_percentage");
  if (!out.ok()) return out.status();
  return ParsePercentage(*out);
}

absl::Status MpsControlClient::SetDefaultActiveThreadPercentage(double percentage) const {
  if (!(percentage > 0 && percentage <= 100)) {
    return absl::InvalidArgumentError(absl::StrCat("active thread percentage ", percentage,
                                                   " is out of range: it must be in (0, 100]"));
  }
  return Run(absl::StrCat("set_default_active_thread_percentage ", percentage)).status();
}

absl::StatusOr<std::string> MpsControlClient::GetDefaultDevicePinnedMemLimit(int device) const {
  absl::StatusOr<std::string> out =
      Run(absl::StrCat("get_default_device_pinned_mem_limit ", device));
  if (!out.ok()) return out.status();
  return std::string(absl::StripAsciiWhitespace(*out));
}

absl::Status MpsControlClient::SetDefaultDevicePinnedMemLimit(int device,
                                                              absl::string_view value) const {
  int64_t amount = 0;
  if (value.size() < 2 || (value.back() != 'G' && value.back() != 'M') ||
      !absl::SimpleAtoi(value.substr(0, value.size() - 1), &amount) || amount <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned memory limit \"", value,
                     "\" must be a positive integer followed by G or M (e.g. 10G, 900M)"));
  }
  return Run(absl::StrCat("set_default_device_pinned_mem_limit ", device, " ", value)).status();
}

absl::Status MpsControlClient::TerminateClient(pid_t server, pid_t client) const {
  absl::StatusOr<std::string> out = Run(absl::StrCat("terminate_client ", server, " ", client));
  if (!out.ok()) return out.status();
  absl::string_view reply = absl::StripAsciiWhitespace(*out);
  if (reply != "0") {
    return absl::UnavailableError(
        absl::StrCat("terminate_client ", server, " ", client, " failed: ", reply));
  }
  return absl::OkStatus();
}

absl::Status MpsControlClient::Quit() const { return Run("quit").status(); }

}  // namespace tessera
