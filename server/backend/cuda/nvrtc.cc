#include "server/backend/cuda/nvrtc.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#include "server/backend/cuda/nvrtc_library.h"

extern char** environ;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TESSERA_SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TESSERA_SANITIZED_BUILD 1
#endif
#endif

namespace tessera::cuda {
namespace {

#ifdef TESSERA_SANITIZED_BUILD
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif

// What the helper may write: an image (cubins of generated kernels are tens of KiB) and a log.
constexpr size_t kMaxHelperImageBytes = 256ull << 20;
constexpr size_t kMaxLogBytes = 1ull << 20;
// The part of NVRTC's log a status carries.
constexpr size_t kLogInStatus = 4096;

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Blocks SIGPIPE on this thread for the scope (a helper that dies before reading its input
// makes our write fail with EPIPE instead of killing the server), and discards one that
// arrived meanwhile.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  ~NoSigpipe() {
    const timespec no_wait{0, 0};
    while (sigtimedwait(&pipe_, nullptr, &no_wait) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_, previous_;
};

std::string ExecutableDirectory() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  std::string dir(path, static_cast<size_t>(n));
  return dir.substr(0, dir.rfind('/') + 1);
}

std::string SignalName(int signal) {
  const char* name = sigabbrev_np(signal);
  return name != nullptr ? absl::StrCat("SIG", name) : absl::StrCat("signal ", signal);
}

std::string Mib(uint64_t bytes) { return absl::StrCat(bytes >> 20, " MiB"); }

}  // namespace

std::string KernelCompiler::DefaultBinary() {
  if (const char* env = std::getenv("TESSERA_KERNEL_COMPILER"); env != nullptr && *env != '\0') {
    return env;
  }
  return ExecutableDirectory() + "tessera-kernel-compiler";
}

KernelCompilerLimits KernelCompiler::DefaultLimits() {
  KernelCompilerLimits limits;
  double seconds = 0;
  if (const char* env = std::getenv("TESSERA_KERNEL_COMPILE_TIMEOUT");
      env != nullptr && absl::SimpleAtod(env, &seconds) && seconds > 0) {
    limits.deadline = absl::Seconds(seconds);
  }
  return limits;
}

absl::StatusOr<KernelCompiler::Output> KernelCompiler::Run(const std::vector<std::string>& args,
                                                           const std::string& input) {
  NoSigpipe no_sigpipe;
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, exec[2] = {-1, -1};
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
      pipe2(exec, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int* fd : {&in[0], &in[1], &out[0], &out[1], &err[0], &err[1], &exec[0], &exec[1]}) {
      CloseFd(*fd);
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the kernel compiler: pipe: ", std::strerror(e)));
  }
  std::vector<std::string> storage = {binary_};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const rlim_t memory = static_cast<rlim_t>(limits_.memory_bytes);
  const rlim_t cpu = static_cast<rlim_t>(limits_.cpu_seconds);
  const rlimit as_limit{memory, memory};
  const rlimit cpu_limit{cpu, cpu + 5};  // SIGXCPU at the soft limit, SIGKILL 5 s later
  sigset_t none;
  sigemptyset(&none);

  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      for (int* fd : {&in[0], &in[1], &out[0], &out[1], &err[0], &err[1], &exec[0], &exec[1]}) {
        CloseFd(*fd);
      }
      return absl::UnavailableError("the CUDA backend is shutting down");
    }
  }
  // _Fork: no fork handlers in a multi-threaded server; the child makes only
  // async-signal-safe calls until exec.
  const pid_t pid = _Fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own group: a deadline kills whatever it started too
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    // No descriptor of the server (sockets, the database) reaches the compiler; `exec[1]`
    // closes at exec (O_CLOEXEC) or carries errno if exec fails.
    if (exec[1] > 3) close_range(3, static_cast<unsigned int>(exec[1]) - 1, 0);
    close_range(static_cast<unsigned int>(exec[1]) + 1, ~0u, 0);
    // A sanitizer build's compiler (built like the server) reserves terabytes of shadow
    // address space at start, which any RLIMIT_AS refuses: there the limit is left off.
    if (!kSanitizedBuild) setrlimit(RLIMIT_AS, &as_limit);
    setrlimit(RLIMIT_CPU, &cpu_limit);
    // The server blocks SIGINT and SIGTERM outside its signal thread; a blocked mask
    // survives exec (see SpawnAttributes in server/mps/control_client.h).
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), environ);
    const int e = errno;
    (void)!write(exec[1], &e, sizeof(e));
    _exit(127);
  }
  CloseFd(in[0]);
  CloseFd(out[1]);
  CloseFd(err[1]);
  CloseFd(exec[1]);
  if (pid < 0) {
    const int e = errno;
    for (int* fd : {&in[1], &out[0], &err[0], &exec[0]}) CloseFd(*fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the kernel compiler: fork: ", std::strerror(e)));
  }
  setpgid(pid, pid);  // as the child does: whichever runs first, kill(-pid) reaches it
  bool stop_now = false;
  {
    absl::MutexLock lock(&mu_);
    running_.insert(pid);
    stop_now = stopped_;
  }
  if (stop_now) kill(-pid, SIGKILL);
  int exec_errno = 0;
  ssize_t got = 0;
  do {
    got = read(exec[0], &exec_errno, sizeof(exec_errno));
  } while (got < 0 && errno == EINTR);
  CloseFd(exec[0]);

  Output o;
  const absl::Time deadline = absl::Now() + limits_.deadline;
  if (got == sizeof(exec_errno)) {
    CloseFd(in[1]);
    CloseFd(out[0]);
    CloseFd(err[0]);
  }
  for (int fd : {in[1], out[0], err[0]}) {
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  size_t written = 0;
  if (input.empty()) CloseFd(in[1]);
  bool overflow = false;
  while (out[0] >= 0 || err[0] >= 0 || in[1] >= 0) {
    const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopped_;
    }
    if (wait_ms <= 0 || stopping || overflow) {
      o.timed_out = wait_ms <= 0;
      break;
    }
    pollfd fds[3] = {{in[1], POLLOUT, 0}, {out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    if (poll(fds, 3, static_cast<int>(std::min<int64_t>(wait_ms, 100))) < 0 && errno != EINTR) {
      break;
    }
    if (in[1] >= 0 && (fds[0].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t n = write(in[1], input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) CloseFd(in[1]);
    }
    for (int i = 1; i < 3; ++i) {
      int& fd = i == 1 ? out[0] : err[0];
      if (fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[65536];
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n > 0) {
        std::string& text = i == 1 ? o.out : o.err;
        text.append(buffer, static_cast<size_t>(n));
        overflow = text.size() > (i == 1 ? kMaxHelperImageBytes : kMaxLogBytes);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        CloseFd(fd);
      }
    }
  }
  for (int* fd : {&in[1], &out[0], &err[0]}) CloseFd(*fd);
  int status = 0;
  bool exited = false;
  while (!o.timed_out && !overflow) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      exited = true;
      break;
    }
    if (done < 0 && errno != EINTR) break;
    if (absl::Now() >= deadline) {
      o.timed_out = true;
      break;
    }
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopped_;
    }
    if (stopping) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (!exited) {
    kill(-pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  bool stopped = false;
  {
    absl::MutexLock lock(&mu_);
    running_.erase(pid);
    stopped = stopped_;
  }
  if (got == sizeof(exec_errno)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the kernel compiler ", binary_, " cannot be run (", std::strerror(exec_errno),
        "); install tessera-kernel-compiler beside tessera-server or set TESSERA_KERNEL_COMPILER"));
  }
  if (stopped) return absl::UnavailableError("the CUDA backend is shutting down");
  if (overflow) {
    return absl::InternalError(absl::StrCat("the kernel compiler wrote more than ",
                                            Mib(kMaxHelperImageBytes), " of image or ",
                                            Mib(kMaxLogBytes), " of messages; it was stopped"));
  }
  if (exited) {
    if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  }
  return o;
}

absl::Status KernelCompiler::Failure(const Output& o, absl::string_view what) const {
  std::string log(absl::StripTrailingAsciiWhitespace(o.err));
  if (log.size() > kLogInStatus) log = absl::StrCat(log.substr(0, kLogInStatus), "\n[...]");
  if (o.timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " took longer than the ", absl::FormatDuration(limits_.deadline),
                     " limit on compiling a kernel; the compiler was stopped"));
  }
  if (o.signal == SIGXCPU) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " used more than the ", limits_.cpu_seconds,
                     " s CPU limit on compiling a kernel; the compiler was stopped"));
  }
  if (o.signal == SIGKILL) {  // past the CPU limit's hard end, or the system's OOM killer
    return absl::UnavailableError(absl::StrCat(
        "the kernel compiler was killed (SIGKILL) in ", what, " (its limits: ", limits_.cpu_seconds,
        " s of CPU, ", Mib(limits_.memory_bytes), " of memory); retry later"));
  }
  if (o.signal != 0) {
    return absl::InternalError(absl::StrCat("the kernel compiler died of ", SignalName(o.signal),
                                            " (its memory limit is ", Mib(limits_.memory_bytes),
                                            ") in ", what, log.empty() ? "" : ": ", log));
  }
  switch (o.exit_code) {
    case kCompilerNoNvrtc:
      return absl::FailedPreconditionError(absl::StrCat(
          "tenant-defined kernels need NVRTC (libnvrtc.so.13 of the CUDA toolkit) on the "
          "server: ",
          log));
    case kCompilerUnsupportedArch:
      return absl::FailedPreconditionError(absl::StrCat(what, ": ", log));
    case kCompilerOutOfMemory:
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needed more than the ", Mib(limits_.memory_bytes),
                       " memory limit on compiling a kernel: ", log));
    case kCompilerRejected:
      return absl::InternalError(absl::StrCat(
          "NVRTC rejected the code generated in ", what,
          " (a bug in Tessera's code generator, not in the kernel; please report it): ", log));
    default:
      return absl::InternalError(absl::StrCat("the kernel compiler ", binary_, " failed in ", what,
                                              " (exit status ", o.exit_code, ")",
                                              log.empty() ? "" : ": ", log));
  }
}

absl::StatusOr<std::string> KernelCompiler::Version() {
  {
    absl::MutexLock lock(&mu_);
    if (!version_.empty()) return version_;
  }
  absl::StatusOr<Output> o = Run({"--version"}, "");
  if (!o.ok()) return o.status();
  if (o->exit_code != kCompilerOk || o->timed_out) {
    return Failure(*o, "asking the kernel compiler for its version");
  }
  std::string version(absl::StripAsciiWhitespace(o->out));
  if (version.empty()) return absl::InternalError("the kernel compiler reports no version");
  absl::MutexLock lock(&mu_);
  version_ = version;
  return version;
}

absl::StatusOr<std::string> KernelCompiler::Compile(const std::string& source, int arch,
                                                    const std::string& name) {
  const std::string what = absl::StrCat("compiling kernel ", name, " for sm_", arch);
  absl::StatusOr<Output> o =
      Run({absl::StrCat("--gpu-architecture=sm_", arch), absl::StrCat("--name=", name)}, source);
  if (!o.ok()) return o.status();
  if (o->exit_code != kCompilerOk || o->timed_out) return Failure(*o, what);
  if (o->out.empty()) {
    return absl::InternalError(absl::StrCat("the kernel compiler returned no image ", what));
  }
  return std::move(o->out);
}

void KernelCompiler::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  for (pid_t pid : running_) kill(-pid, SIGKILL);
}

}  // namespace tessera::cuda
