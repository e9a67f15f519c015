// tessera-server: serves the Tessera gRPC API. See README.md for the flags.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "grpc/support/log.h"
#include "spdlog/spdlog.h"

#include "common/byte_size.h"
#include "server/common/logging.h"
#include "server/common/systemd.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "host:port to serve on (port 0: any free port)");
ABSL_FLAG(std::string, unix_socket, "",
          "Also serve on this Unix-domain socket path (mode 0660, plaintext, same services and "
          "credentials), with the shared-memory regions' descriptor socket at PATH.regions");
ABSL_FLAG(std::string, unix_socket_group, "",
          "Group of --unix_socket and its descriptor socket (default: the server's group)");
ABSL_FLAG(std::string, state_dir, "./var", "Directory for the tenant table and admin token");
ABSL_FLAG(std::string, admin_token_file, "",
          "Admin token file (default STATE_DIR/admin.token, created 0600 when absent); the "
          "TESSERA_ADMIN_TOKEN environment variable overrides it");
ABSL_FLAG(std::string, backend, "auto", "Execution backend: auto, cpu or cuda");
ABSL_FLAG(std::string, mps, "auto", "MPS use: auto, require or off");
ABSL_FLAG(std::string, fleet_etcd, "",
          "Fleet mode: etcd's client URLs (http://HOST:PORT[,...]); the node's entry and its "
          "tenants' directory live there (docs/fleet.md). Empty: a single server");
ABSL_FLAG(std::string, node_name, "", "Fleet mode: this node's name (default: the host name)");
ABSL_FLAG(std::string, advertise_address, "",
          "Fleet mode: host:port other nodes and clients reach this node at (default: --listen "
          "when it names a host and a port)");
ABSL_FLAG(absl::Duration, fleet_lease_ttl, absl::Seconds(10),
          "Fleet mode: the node leaves the fleet this long after its last lease renewal "
          "(2s..10m)");
ABSL_FLAG(std::string, fleet_placement, "spread",
          "Fleet mode: where RegisterTenant puts a tenant: spread (the node with the most free "
          "memory) or pack (the least that fits)");
ABSL_FLAG(bool, fleet_forward, true,
          "Fleet mode: forward a tenant's calls that reach this node to its home node (one "
          "hop) unless the client sends tessera-follow-home: 1; false: answer them with the "
          "redirect (FAILED_PRECONDITION naming the home). A node serving TLS never forwards");
ABSL_FLAG(bool, cuda_graphs, true,
          "Run a program (a Submit of several steps) as a CUDA graph from its second run on the "
          "same stream and shapes: one launch instead of one per step");
ABSL_FLAG(bool, cuda_single_launch_graphs, false,
          "With --cuda_graphs, run a single launch as a CUDA graph too from its second run (off: "
          "one kernel launch is one driver call either way; measure with gpu_bench)");
ABSL_FLAG(std::string, cuda_completion, "auto",
          "How the CUDA backend sees jobs end: spin (a thread polls in-flight jobs, spinning "
          "briefly, then backing off; idle when none runs), host_function (one per job), or "
          "auto (spin with 4 or more CPUs, else host_function)");
ABSL_FLAG(std::string, health_listen, "",
          "host:port serving only grpc.health.v1 in plaintext, with the main port's status (for "
          "probes that cannot do TLS, such as the kubelet's gRPC probe); empty: off");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT, [IPV6]:PORT or :PORT (loopback) for Prometheus metrics (GET /metrics); "
          "a non-loopback address needs --metrics_token_file or --metrics_tls_client_ca; "
          "empty: off");
ABSL_FLAG(std::string, metrics_token_file, "",
          "File with the bearer token every scrape must send (Authorization: Bearer TOKEN)");
ABSL_FLAG(std::string, metrics_tls_cert, "",
          "PEM certificate: serve /metrics over HTTPS (with --metrics_tls_key)");
ABSL_FLAG(std::string, metrics_tls_key, "", "PEM private key for --metrics_tls_cert");
ABSL_FLAG(std::string, metrics_tls_client_ca, "",
          "PEM CA bundle: scrapes must present a client certificate it signed");
ABSL_FLAG(std::string, metrics_tenant_label, "id",
          "How tenants appear in metric labels: id, hash (first 12 hex digits of SHA-256) or "
          "none (per-tenant series summed)");
ABSL_FLAG(std::string, access_log, "all",
          "Access log, one line per RPC: all, errors (calls not OK) or off");
ABSL_FLAG(uint32_t, access_log_sample, 1,
          "Log one in N successful calls of each method (failures always); 1: every call");
ABSL_FLAG(bool, mps_manage, false,
          "Start (or find) one MPS control daemon for this server's GPUs before the CUDA driver "
          "initializes, and join it; a daemon started here is quit at shutdown once no other "
          "client remains");
ABSL_FLAG(std::string, mps_base_dir, "",
          "Directory of the managed daemon's pipe/ and log/ (default: <state_dir>/mps)");
ABSL_FLAG(std::string, mps_control, "nvidia-cuda-mps-control",
          "The MPS control executable (looked up on PATH unless it has a slash)");
ABSL_FLAG(absl::Duration, mps_timeout, absl::Seconds(5),
          "Longest wait for one MPS control command");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (enables TLS with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a "
          "certificate it signed (mutual TLS)");
ABSL_FLAG(std::string, log_format, "text", "Log format: text or json");
ABSL_FLAG(std::string, log_level, "info", "Log level: trace, debug, info, warn, error, off");
ABSL_FLAG(tessera::ByteSize, max_message_bytes, tessera::ByteSize{64 << 20},
          "Largest gRPC message in either direction (64KiB..2GiB-1)");
ABSL_FLAG(double, memory_overcommit, 1.0,
          "Admission: reserved memory per device may reach capacity x this (0.01..100)");
ABSL_FLAG(uint32_t, device_in_flight, 0,
          "Most jobs released to a device at once, all tenants together; the rest wait in "
          "per-stream queues (cancellable, released in weighted fair order). 0: the backend's "
          "default (no bound on the CPU backend, 256 per GPU)");
ABSL_FLAG(uint32_t, max_kernels_per_tenant, 64,
          "Tenant-defined kernels (DefineKernel) each tenant may have (1..10000)");
ABSL_FLAG(tessera::ByteSize, cpu_memory_bytes, tessera::ByteSize{0},
          "CPU backend capacity, e.g. 8GiB (0: half of physical memory, or of the cgroup "
          "memory limit when lower)");
ABSL_FLAG(uint32_t, cpu_threads, 0,
          "CPU backend worker threads (0: one per CPU this process may use: the affinity mask, "
          "or the cgroup CPU quota when lower)");
ABSL_FLAG(int32_t, cpu_worker_nice, 0,
          "Nice value of the CPU backend's worker threads, 0..19: above 0, request handling "
          "preempts running kernels (a quiet tenant's call waits less beside busy ones), but "
          "any other process on the host then takes CPU from the kernels first");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::ZeroDuration(),
          "On SIGTERM: time health reports NOT_SERVING before the port closes");
#ifdef NDEBUG
constexpr char kDefaultDeadlockDetection[] = "off";
#else
constexpr char kDefaultDeadlockDetection[] = "abort";
#endif
ABSL_FLAG(std::string, deadlock_detection, kDefaultDeadlockDetection,
          "Abseil Mutex lock-order checking: abort (report a potential deadlock and abort), "
          "log (report it and go on) or off. On in debug builds and in the test suite; off by "
          "default in release builds, where the global lock graph costs ~3% CPU on tiny "
          "launches");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10),
          "On SIGTERM: longest wait for in-flight calls before they are cancelled");

namespace {

// SIGINT/SIGTERM are turned into a byte on this pipe by an async-signal-safe handler, so
// shutdown starts whichever thread the kernel picks (libraries such as OpenBLAS start
// threads before main runs, with the signals unblocked).
//
// Every thread that the server starts has both signals blocked (they are blocked in main
// before it starts any, and threads inherit the mask); main unblocks them only while it waits.
// So the handler never interrupts a gRPC, backend or scheduler thread's system call, and
// under ThreadSanitizer, which runs a handler only when its thread next leaves an intercepted
// call, it cannot be put off for ever in a thread parked in a raw futex wait.
int signal_pipe[2] = {-1, -1};

sigset_t ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

// Written to the pipe (instead of a signal number) when the backend reports a fatal error.
constexpr char kBackendFatal = 'F';
// The exit status then: EX_TEMPFAIL (sysexits.h), "try again later".
constexpr int kBackendFatalExit = 75;

extern "C" void OnShutdownSignal(int signal_number) {
  char byte = static_cast<char>(signal_number);
  ssize_t ignored = write(signal_pipe[1], &byte, 1);
  (void)ignored;
}

absl::Status InstallSignalHandlers() {
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  struct sigaction action = {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  // No SA_RESTART: the waiting read() returns EINTR. ThreadSanitizer runs a handler only when
  // its thread leaves an intercepted call, so a restarted read() would wait for ever.
  action.sa_flags = 0;
  if (sigaction(SIGINT, &action, nullptr) != 0 || sigaction(SIGTERM, &action, nullptr) != 0) {
    return absl::InternalError("sigaction failed");
  }
  sigset_t signals = ShutdownSignals();
  if (pthread_sigmask(SIG_BLOCK, &signals, nullptr) != 0) {
    return absl::InternalError("pthread_sigmask failed");
  }
  return absl::OkStatus();
}

/// Blocks until SIGINT or SIGTERM arrives; returns which.
int WaitForShutdownSignal() {
  sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);  // one that came already is delivered now
  char byte = 0;
  while (read(signal_pipe[0], &byte, 1) != 1) {
  }
  return byte;
}

int Fail(const absl::Status& status) {
  if (tessera::LogIsJson()) {  // stdout stays one JSON object per line
    tessera::LogEvent(
        spdlog::level::critical, "start-up failed",
        {{"error", status.message()}, {"code", absl::StatusCodeToString(status.code())}});
    spdlog::default_logger()->flush();
  } else {
    std::fprintf(stderr, "tessera-server: %s\n", std::string(status.message()).c_str());
  }
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

// gRPC's own log lines (gpr_log) go through our logger, in our format.
void LogFromGrpc(gpr_log_func_args* args) {
  spdlog::level::level_enum level = args->severity == GPR_LOG_SEVERITY_ERROR ? spdlog::level::err
                                    : args->severity == GPR_LOG_SEVERITY_INFO
                                        ? spdlog::level::info
                                        : spdlog::level::debug;
  tessera::LogEvent(level, args->message != nullptr ? args->message : "",
                    {{"source", "grpc"},
                     {"file", args->file != nullptr ? args->file : ""},
                     {"line", static_cast<int64_t>(args->line)}});
}

// ---- --help and --version ----------------------------------------------------------------------

constexpr char kUsage[] =
    "Serves the Tessera multi-tenant GPU API (gRPC: TenantAdmin, Compute, health, reflection).\n"
    "\n"
    "Usage: tessera-server [--listen=HOST:PORT] [--state_dir=DIR] [--backend=auto|cpu|cuda] "
    "[FLAGS]";

// The flags of this file by topic, in the order --help lists them. A flag missing here is
// listed under "Other", so --help never leaves one out.
struct FlagTopic {
  const char* title;
  std::vector<const char*> flags;
};
const std::vector<FlagTopic>& FlagTopics() {
  static const std::vector<FlagTopic> topics = {
      {"Serving",
       {"listen", "unix_socket", "unix_socket_group", "state_dir", "admin_token_file",
        "health_listen", "max_message_bytes", "shutdown_grace", "drain_timeout"}},
      {"TLS", {"tls_cert", "tls_key", "tls_client_ca"}},
      {"Backend and admission",
       {"backend", "cpu_memory_bytes", "cpu_threads", "cpu_worker_nice", "memory_overcommit",
        "device_in_flight", "max_kernels_per_tenant", "cuda_completion", "cuda_graphs",
        "cuda_single_launch_graphs"}},
      {"MPS", {"mps", "mps_manage", "mps_base_dir", "mps_control", "mps_timeout"}},
      {"Fleet",
       {"fleet_etcd", "node_name", "advertise_address", "fleet_lease_ttl", "fleet_placement",
        "fleet_forward"}},
      {"Metrics",
       {"metrics_listen", "metrics_token_file", "metrics_tls_cert", "metrics_tls_key",
        "metrics_tls_client_ca", "metrics_tenant_label"}},
      {"Logging", {"log_format", "log_level", "access_log", "access_log_sample"}},
      {"Debugging", {"deadlock_detection"}},
  };
  return topics;
}

bool IsThisFile(absl::string_view filename) { return absl::EndsWith(filename, "server/main.cc"); }

// `text` wrapped at 96 columns, each line indented by `indent` spaces.
std::string Wrapped(absl::string_view text, size_t indent) {
  std::string out(indent, ' ');
  size_t column = indent;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > indent && column + 1 + word.size() > 96) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
    } else if (column > indent) {
      out.push_back(' ');
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
  }
  return out;
}

std::string FlagHelp(const absl::CommandLineFlag& flag) {
  const std::string default_value = flag.DefaultValue();
  return absl::StrCat("  --", flag.Name(),
                      " (default: ", default_value.empty() ? "\"\"" : default_value, ")\n",
                      Wrapped(flag.Help(), 6), "\n");
}

// Every flag of tessera-server by topic with its default (absl's own --help groups flags by
// source file, and all of them are in this one).
std::string ServerHelp() {
  std::string out = absl::StrCat(kUsage, "\n");
  std::set<std::string> listed;
  for (const FlagTopic& topic : FlagTopics()) {
    absl::StrAppend(&out, "\n", topic.title, ":\n");
    for (const char* name : topic.flags) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag == nullptr) continue;
      absl::StrAppend(&out, FlagHelp(*flag));
      listed.insert(name);
    }
  }
  std::vector<const absl::CommandLineFlag*> others;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsThisFile(flag->Filename()) && !listed.contains(std::string(name))) {
      others.push_back(flag);
    }
  }
  std::sort(others.begin(), others.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  if (!others.empty()) absl::StrAppend(&out, "\nOther:\n");
  for (const absl::CommandLineFlag* flag : others) absl::StrAppend(&out, FlagHelp(*flag));
  absl::StrAppend(&out, "\nSizes: ", tessera::kSizeSyntax,
                  " (as Kubernetes reads them).\nDurations: ms, s, m, h (e.g. 30s, 1m30s).\n"
                  "--version prints the version and build; --helpfull also lists the flags of "
                  "the libraries.\n"
                  "README.md and docs/operations.md describe deployment.\n");
  return out;
}

#if TESSERA_LINKS_TCMALLOC
extern "C" const char* tc_version(int* major, int* minor, const char** patch);
#endif

// The malloc this process runs on, as found at run time: tcmalloc and its version when it is
// the one linked (server/CMakeLists.txt), else the library whose malloc the loader bound
// (glibc's, or an LD_PRELOADed one).
std::string Allocator() {
  Dl_info info{};
  void* const found = dlsym(RTLD_DEFAULT, "malloc");
  std::string library = found != nullptr && dladdr(found, &info) != 0 && info.dli_fname != nullptr
                            ? std::string(info.dli_fname)
                            : std::string("unknown");
  library = library.substr(library.rfind('/') + 1);
#if TESSERA_LINKS_TCMALLOC
  if (absl::StrContains(library, "tcmalloc")) {
    int major = 0, minor = 0;
    const char* patch = nullptr;
    const char* version = tc_version(&major, &minor, &patch);
    return absl::StrCat("tcmalloc (", version != nullptr ? version : "gperftools", ", ", library,
                        ")");
  }
#endif
  return absl::StrCat("malloc from ", library);
}

std::string ServerVersion() {
  const tessera::BuildInfo build = tessera::TesseraBuild();
  return absl::StrCat("tessera-server ", build.version, "\n", "build type:   ", build.build_type,
                      "\n", "git revision: ", build.git_revision, "\n", "CUDA toolkit: ",
                      build.cuda_toolkit.empty()
                          ? "none (built without the CUDA module)"
                          : absl::StrCat(build.cuda_toolkit, " (the CUDA module)"),
                      "\n", "allocator:    ", Allocator(), "\n");
}

// absl prints these for --helpshort, --helpfull and --version; --help (and -h) print
// ServerHelp and exit 0 before absl parses (its --help exits 1).
void ConfigureUsage() {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsThisFile;
  config.contains_helpshort_flags = IsThisFile;
  config.contains_helppackage_flags = IsThisFile;
  config.version_string = ServerVersion;
  config.normalize_filename = [](absl::string_view filename) {
    const size_t at = filename.rfind("server/");
    return std::string(at == absl::string_view::npos ? filename : filename.substr(at));
  };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(kUsage);
}

bool AsksForHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpshort" ||
        arg == "-helpshort") {
      return true;
    }
  }
  return false;
}

std::string GrpcurlHost(const std::string& listen, int port) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  return absl::StrCat(host, ":", port);
}

}  // namespace

// main's steps, in order.

// glibc's malloc tuned for message-sized blocks.
void TuneMalloc() {
  // gRPC allocates each received message (up to --max_message_bytes, 1 MiB chunks in
  // transfers) with malloc; glibc's default serves those from fresh mmaps and trims freed
  // heap eagerly, so every chunk paid its page faults again. Tensors have their own mappings
  // (server/backend/cpu), so keeping message-sized blocks on the heap costs little.
  // Only on glibc's malloc: tcmalloc, when linked, keeps freed blocks for reuse by itself
  // (and its mallopt does nothing).
#if !TESSERA_LINKS_TCMALLOC
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
#endif
}

// --deadlock_detection; false (after saying why) for a value that is not one.
bool SetDeadlockDetection() {
  // Debian builds Abseil without NDEBUG, which leaves Mutex deadlock detection on: a global
  // lock-order graph updated on every lock. The flag decides, before any thread starts.
  const std::string deadlock_detection = absl::GetFlag(FLAGS_deadlock_detection);
  if (deadlock_detection == "abort") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  } else if (deadlock_detection == "log") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kReport);
  } else if (deadlock_detection == "off") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  } else {
    std::fprintf(stderr, "tessera-server: --deadlock_detection is \"%s\"; use abort, log or off\n",
                 deadlock_detection.c_str());
    return false;
  }
  return true;
}

// Signal handlers, the umask, logging (ours, gRPC's and protobuf's).
absl::Status StartProcess() {
  if (absl::Status s = InstallSignalHandlers(); !s.ok()) return s;
  umask(077);  // state files hold credentials (hashes) and the admin token

  if (absl::Status s =
          tessera::InitLogging(absl::GetFlag(FLAGS_log_format), absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    return s;
  }

  gpr_set_log_function(LogFromGrpc);
  // protobuf's complaints about requests (invalid UTF-8 in a string field: one per request)
  // go through our logger too, at most 10 lines a second.
  tessera::RouteProtobufLogging(10);
  spdlog::info("allocator: {}", Allocator());

  return absl::OkStatus();
}

// The server's options from the flags.
absl::StatusOr<tessera::ServerOptions> OptionsFromFlags() {
  tessera::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.unix_socket = absl::GetFlag(FLAGS_unix_socket);
  options.unix_socket_group = absl::GetFlag(FLAGS_unix_socket_group);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  if (const char* env = std::getenv("TESSERA_ADMIN_TOKEN")) options.admin_token_env = env;
  options.backend.backend = absl::GetFlag(FLAGS_backend);
  options.backend.mps = absl::GetFlag(FLAGS_mps);
  options.backend.cuda_completion = absl::GetFlag(FLAGS_cuda_completion);
  options.backend.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.backend.cuda_single_launch_graphs = absl::GetFlag(FLAGS_cuda_single_launch_graphs);
  options.fleet = {.etcd = absl::GetFlag(FLAGS_fleet_etcd),
                   .node_name = absl::GetFlag(FLAGS_node_name),
                   .advertise_address = absl::GetFlag(FLAGS_advertise_address),
                   .lease_ttl = absl::GetFlag(FLAGS_fleet_lease_ttl),
                   .placement = absl::GetFlag(FLAGS_fleet_placement),
                   .forward = absl::GetFlag(FLAGS_fleet_forward)};
  options.metrics = {.listen = absl::GetFlag(FLAGS_metrics_listen),
                     .token_file = absl::GetFlag(FLAGS_metrics_token_file),
                     .tls_cert = absl::GetFlag(FLAGS_metrics_tls_cert),
                     .tls_key = absl::GetFlag(FLAGS_metrics_tls_key),
                     .tls_client_ca = absl::GetFlag(FLAGS_metrics_tls_client_ca)};
  options.metrics_tenant_label = absl::GetFlag(FLAGS_metrics_tenant_label);
  options.access_log = {.mode = absl::GetFlag(FLAGS_access_log),
                        .sample = absl::GetFlag(FLAGS_access_log_sample)};
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  options.mps_ops = tessera::MpsOpsOptions{.manage = absl::GetFlag(FLAGS_mps_manage),
                                           .base_directory = absl::GetFlag(FLAGS_mps_base_dir),
                                           .binary = absl::GetFlag(FLAGS_mps_control),
                                           .timeout = absl::GetFlag(FLAGS_mps_timeout)};
  options.backend.cpu_memory_bytes = absl::GetFlag(FLAGS_cpu_memory_bytes).bytes;
  options.backend.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.backend.cpu_worker_nice = absl::GetFlag(FLAGS_cpu_worker_nice);
  if (options.backend.cpu_worker_nice < 0 || options.backend.cpu_worker_nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpu_worker_nice is ", options.backend.cpu_worker_nice, "; the range is 0..19"));
  }
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  uint64_t max_message = absl::GetFlag(FLAGS_max_message_bytes).bytes;
  options.max_message_bytes =
      max_message > uint64_t{1} << 40 ? int64_t{1} << 40 : static_cast<int64_t>(max_message);
  options.memory_overcommit = absl::GetFlag(FLAGS_memory_overcommit);
  options.device_in_flight = absl::GetFlag(FLAGS_device_in_flight);
  options.max_kernels_per_tenant = absl::GetFlag(FLAGS_max_kernels_per_tenant);
  options.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  // The backend has logged why; the main thread logs the shutdown (below).
  options.on_backend_fatal = [](const absl::Status&) {
    ssize_t ignored = write(signal_pipe[1], &kBackendFatal, 1);
    (void)ignored;
  };

  return options;
}

// The banner (stdout; logs go to stderr): where the server listens and how to try it.
void PrintBanner(const tessera::Server& server) {
  // The banner goes to stdout (logs go to stderr); tests wait for its first line.
  const tessera::AdminCredential& admin = server.admin_credential();
  std::string address = GrpcurlHost(absl::GetFlag(FLAGS_listen), server.port());
  bool from_file = admin.source != "$TESSERA_ADMIN_TOKEN";
  std::string security = server.transport_security() == "insecure"
                             ? "-plaintext"
                             : "-cacert CA.pem";  // the operator knows their CA
  const std::string token_arg =
      from_file ? absl::StrCat("$(cat ", admin.source, ")") : "$TESSERA_ADMIN_TOKEN";
  const std::string try_command =
      absl::StrCat("grpcurl ", security, " -H \"authorization: Bearer ", token_arg, "\" ", address,
                   " tessera.v1.TenantAdmin/GetServerInfo");
  if (tessera::LogIsJson()) {
    tessera::LogEvent(
        spdlog::level::info,
        absl::StrCat("tessera-server listening on ", address, " (", server.backend_reason(), ")"),
        {{"address", address},
         {"backend", server.backend_reason()},
         {"admin_token", admin.source},
         {"admin_token_generated", admin.created ? "true" : "false"},
         {"try", try_command},
         {"unix_socket", absl::GetFlag(FLAGS_unix_socket)}});
    spdlog::default_logger()->flush();
  } else {
    std::cout << "tessera-server listening on " << address << " (" << server.backend_reason()
              << ")\n"
              << "admin token: " << admin.source << (admin.created ? " (generated now)" : "")
              << "\n"
              << "try: " << try_command << std::endl;
    if (!absl::GetFlag(FLAGS_unix_socket).empty()) {
      std::cout << "unix socket: " << absl::GetFlag(FLAGS_unix_socket)
                << " (clients on this node: TESSERA_ADDR=unix:" << absl::GetFlag(FLAGS_unix_socket)
                << "; grpcurl -plaintext -unix " << absl::GetFlag(FLAGS_unix_socket) << " ...)"
                << std::endl;
    }
  }
}

// Ready for systemd; serves until a signal or a fatal backend error; the exit code.
int ServeUntilSignal(tessera::Server& server) {
  const std::string address = GrpcurlHost(absl::GetFlag(FLAGS_listen), server.port());
  // Under systemd (Type=notify): ready only now that the port serves.
  tessera::NotifyServiceManager(
      absl::StrCat("READY=1\nSTATUS=serving on ", address, " (", server.backend_reason(), ")"));

  int signal_number = WaitForShutdownSignal();
  if (signal_number == kBackendFatal) {
    // The backend can run nothing more in this process (a CUDA error the driver makes fatal
    // to it); exiting non-zero lets systemd (Restart=on-failure) or the kubelet start a
    // fresh process, which the tenants' durable registrations survive.
    spdlog::critical("shutting down after a fatal backend error; exit {} for a restart",
                     kBackendFatalExit);
    tessera::NotifyServiceManager("STOPPING=1\nSTATUS=restarting after a fatal GPU fault");
    server.Shutdown();
    spdlog::default_logger()->flush();
    return kBackendFatalExit;
  }
  spdlog::info("received {}; shutting down", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  tessera::NotifyServiceManager("STOPPING=1\nSTATUS=shutting down");
  server.Shutdown();
  return 0;
}

int main(int argc, char** argv) {
  TuneMalloc();
  ConfigureUsage();
  if (AsksForHelp(argc, argv)) {
    std::cout << ServerHelp();
    return 0;
  }
  absl::ParseCommandLine(argc, argv);
  if (!SetDeadlockDetection()) return 2;
  if (absl::Status s = StartProcess(); !s.ok()) return Fail(s);
  absl::StatusOr<tessera::ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<std::unique_ptr<tessera::Server>> server =
      tessera::Server::Create(*std::move(options));
  if (!server.ok()) return Fail(server.status());
  if (absl::Status s = (*server)->Start(); !s.ok()) return Fail(s);
  PrintBanner(**server);
  return ServeUntilSignal(**server);
}
