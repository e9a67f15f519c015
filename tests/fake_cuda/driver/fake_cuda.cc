// A CUDA driver for hosts without a GPU: libcuda.so.1 exporting cuGetProcAddress_v2 and
// cuDriverGetVersion like NVIDIA's, serving the CUDA 13 entry points the CUDA backend module
// uses. Device memory is host memory, every stream is a thread that runs its operations in
// order, and a kernel launch runs our own kernel sources (kernels/cuda/*.cu) compiled for the
// host, every thread of every block, with every load and store checked (device.h,
// device_runtime.cc), so the backend's own code (contexts, streams, staging, completion,
// launch geometry, faults) and the kernels' code run unchanged on CI machines. A kernel's
// memory fault (another context's memory, past an allocation's end, ...) is printed as
// "fake libcuda: device fault: ..." with the kernel, block, thread and address, and is what it
// is on a GPU: an illegal address, sticky for the whole process. As NVIDIA documents for
// these errors ("the process must be terminated and relaunched") and as an H100 showed
// (driver 580: after one context's illegal address another context's next call and every
// cuCtxCreate failed with it, also once the faulting context was destroyed), every context
// of the process gets the error and no context can be created again (cuCtxCreate and
// cuGreenCtxCreate return it) until tessera_fake_cuda_reset, which stands for a new process.
// Other sticky errors (CUDA_ERROR_MPS_CLIENT_TERMINATED, ECC) stay with their context.
//
// It behaves like the driver where the backend depends on it and is strict where the real
// one would be undefined: a call that needs a current context without one, memory touched
// outside the stream context's allocations, a stream used from another context, a pop with
// nothing pushed. Each such misuse is printed to stderr and counted
// (tessera_fake_cuda_misuses); tests assert the count stays zero.
//
// Host memory: cuMemHostRegister pins a range for the current context (tracked per context;
// a range overlapping a registered or cuMemHostAlloc'd one is
// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED; cuMemHostUnregister takes the base pointer, in
// the registering context). A host<->device copy whose host range starts inside registered or
// pinned memory must lie wholly inside it, and a copy from a registered range must still find
// it registered when it runs. Copies are counted by the host memory they use (direct from a
// registered range, staging from cuMemHostAlloc'd memory, pageable:
// tessera_fake_cuda_host_copies), so tests see which path a transfer took.
//
// Object accounting: every object the driver hands out with a destroy call of its own
// (contexts plain and green, streams, events, device and pinned host allocations, host
// registrations, libraries, modules)
// is counted from creation until it ends, and how it ended is recorded, so that tests fail on
// leaks (tests/fake_cuda/driver/fake_cuda.h reads the counts; a process that still has any
// at exit prints them to stderr as "fake libcuda: leak: ..." lines). Ending by its own
// destroy call is the only clean end. An object still alive when its context is destroyed
// ends with the context, and which fate it gets follows the driver's documented semantics:
//   - cuCtxDestroy of a healthy context frees its streams, events and memory (cuda.h says so):
//     "freed with context". Legal, but the caller forgot them, and a server that relies on
//     it holds them for the context's whole life; the tests count it as a leak.
//   - cuGreenCtxDestroy frees none of them: cuda.h says streams must be destroyed first or
//     leak (and cuStreamDestroy afterwards fails), and memory and events made while the green
//     context was current belong to the device's primary context, which lives while any green
//     context on the device does: "outlived green context", a real leak in a long-lived
//     process that rebuilds or replaces green contexts.
//   - A context faulted by a sticky error can do nothing but be destroyed, and that frees
//     what it held: "freed after fault", not a leak. Except for a green context's streams,
//     which must be destroyed even then and still count as outlived.
// The fake frees the memory in every case (so that one leak does not exhaust the device for
// the tests after it) and stops a dead context's stream threads; the counts are the signal.
// Objects without a destroy call of their own are not counted: kernels (they go with their
// library), resource descriptors, and the primary context green contexts retain (the fake has
// none; what a green context makes counts against the green context).
//
// Failure injection (tessera_fake_cuda_fail): a test makes one later call of an entry point
// that creates an object or finishes a job's submission fail, to check what the caller gives
// back on its error paths.
//
// Steered by the environment, read at cuInit:
//   TESSERA_FAKE_CUDA_DEVICES   devices (default 1; 0: cuInit fails with no device)
//   TESSERA_FAKE_CUDA_SMS       SMs per device (default 132)
//   TESSERA_FAKE_CUDA_MEMORY_MIB device memory (default 4096; only counted)
//   TESSERA_FAKE_CUDA_CC        compute capability, "MAJOR[.MINOR]" (default 9.0), or one per
//                               device separated by commas ("8.0,9.0")
//   TESSERA_FAKE_CUDA_GREEN     "1" green contexts (default), "0" no green entry points,
//                               "fail" entry points present but creation fails
//   TESSERA_FAKE_CUDA_FAULT_KERNEL  a kernel name: each launch of it ends in an illegal
//                               address instead of running (a server-level fault for tests)
// MPS: the driver joins a control daemon when CUDA_MPS_PIPE_DIRECTORY (default
// /tmp/nvidia-mps) holds a live daemon's pid file, as the fake daemon in
// tests/testing/fake_mps writes. Then contexts take an execution-affinity SM count (rounded
// up to an even count), at most 48 (16 before Volta) live per device, and a fatal fault is
// reported to every context on the device; new contexts there get
// CUDA_ERROR_MPS_SERVER_NOT_READY until all of the faulted ones are destroyed.
#include "tests/fake_cuda/driver/fake_cuda.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include "tests/fake_cuda/driver/host_kernels.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace tf = ::tessera::fake_cuda;
using Clock = std::chrono::steady_clock;
using ::tessera::testing::FakeCudaHostCopies;
using ::tessera::testing::FakeCudaKind;
using ::tessera::testing::FakeCudaTally;

struct CUctx_st;

namespace {

constexpr uint64_t kContextOverhead = 64ull << 20;  // device memory a context holds
// Bytes after each allocation that belong to no allocation, so that an access just past one
// never lands in the next (kernels' accesses are checked against the size requested anyway).
constexpr uint64_t kGuardBytes = 256;
constexpr unsigned char kGuardPattern = 0xFD;
constexpr int kDriverVersion = 13000;

std::atomic<int> g_misuses{0};

void Misuse(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  std::fprintf(stderr, "fake libcuda: misuse: %s\n", text);
  g_misuses.fetch_add(1);
}

// Faults of kernels (device_runtime.cc): counted and the last one kept, for tests.
std::mutex g_device_error_mu;
int g_device_errors = 0;
std::string g_device_error;

void DeviceError(const std::string& message) {
  std::fprintf(stderr, "fake libcuda: device fault: %s\n", message.c_str());
  std::lock_guard<std::mutex> lock(g_device_error_mu);
  ++g_device_errors;
  g_device_error = message;
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::atoi(v);
}

struct Device {
  int sms = 0;
  int cc_major = 0;
  int cc_minor = 0;
  uint64_t memory = 0;
  uint64_t used = 0;
  int mps_clients = 0;    // live contexts while MPS is connected
  int faulted_alive = 0;  // MPS: faulted contexts not destroyed yet (server in FAULT)
};

struct Allocation {
  uint64_t size;       // what the device accounts: the request rounded up to 256 bytes
  uint64_t requested;  // what the caller asked for: the only bytes it may touch
  CUctx_st* context;
};

// A host range registered with cuMemHostRegister; its Tracked handle is this struct.
struct HostRegistration {
  uintptr_t base;
  uint64_t bytes;
  CUctx_st* context;
  bool portable;    // CU_MEMHOSTREGISTER_PORTABLE: pinned for every context
  uint64_t serial;  // tells a later registration of the same range apart
};

// How a counted object ended when not by its own destroy call (see the top of this file).
enum class Fate { kFreedWithContext, kOutlivedGreenContext, kFreedAfterFault };

// A live counted object.
struct Tracked {
  FakeCudaKind kind;
  const CUctx_st* owner;  // whose destruction ends it; null for contexts and libraries
  const char* origin;     // the call that made it, for the report
  uint64_t generation;    // counted only while it equals Global::generation
};

struct Global {
  std::mutex mu;
  bool initialized = false;
  bool mps = false;
  std::string green = "1";
  std::string fault_kernel;  // TESSERA_FAKE_CUDA_FAULT_KERNEL
  std::vector<Device> devices;
  std::map<uintptr_t, Allocation> allocations;        // device memory by start address
  std::map<uintptr_t, uint64_t> pinned;               // cuMemHostAlloc'd memory: start, size
  std::map<uintptr_t, HostRegistration*> registered;  // by start address; owned
  uint64_t registrations = 0;                         // serials handed out
  FakeCudaHostCopies host_copies;                     // since the last reset
  std::set<CUctx_st*> contexts;                       // live ones
  // Object accounting since the last reset (tessera_fake_cuda_reset bumps `generation`).
  uint64_t generation = 0;
  std::map<const void*, Tracked> live;  // by handle (device memory: by address)
  std::array<long, tessera::testing::kFakeCudaKinds> created{};
  std::map<std::tuple<FakeCudaKind, std::string, Fate>, long> ended;  // not by their own call
  // An injected failure: the call of `fail_call` after `fail_after` more succeed fails.
  std::string fail_call;
  int fail_after = 0;
  CUresult fail_error = CUDA_SUCCESS;
  // A process-fatal error seen (see the top of this file): no context can be created.
  CUresult poisoned = CUDA_SUCCESS;
  // What the fake keeps after its destroy call (contexts, streams, events, libraries,
  // modules: see each), reachable, so that LeakSanitizer does not report the fake's own
  // bookkeeping as a leak of the process under test.
  std::vector<const void*> kept;
};

Global& G() {
  static Global* g = new Global();  // never destroyed: stream threads may outlive statics
  return *g;
}

// Keeps `handle`'s struct reachable for the process (Global::kept); takes G().mu.
void Keep(const void* handle) {
  std::lock_guard<std::mutex> lock(G().mu);
  G().kept.push_back(handle);
}

}  // namespace

struct CUstream_st;

struct CUctx_st {
  int device = 0;
  int sms = 0;
  bool green = false;
  std::atomic<bool> destroyed{false};
  std::atomic<int> sticky{CUDA_SUCCESS};
  bool counted_fault = false;  // guarded by G().mu
  std::vector<CUstream_st*> streams;
  // Library kernels loaded into this context (guarded by G().mu): see Fake_cuLaunchKernel.
  std::set<const void*> loaded_kernels;
};

struct CUgreenCtx_st {
  CUctx_st* context = nullptr;
};

struct CUdevResourceDesc_st {
  int device = -1;
  unsigned int sms = 0;
};

struct CUevent_st {
  CUctx_st* context = nullptr;
  bool timing = true;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;  // records issued
  uint64_t reached = 0;   // records the stream has passed
  Clock::time_point when{};
};

// A graph's node: what it does, and what kind of node it is (a kernel's name, "memcpy",
// "memset", "cublas", "host function"), which cuGraphExecUpdate compares.
struct GraphNode {
  std::string kind;
  std::function<CUresult()> run;
};

// A captured graph (cuStreamEndCapture): its nodes in stream order. The fake captures only
// one stream, so a graph is a chain.
struct CUgraph_st {
  CUctx_st* context = nullptr;
  std::vector<GraphNode> nodes;
};

struct CUgraphExec_st {
  CUctx_st* context = nullptr;
  std::vector<GraphNode> nodes;
};

struct CUstream_st {
  CUctx_st* context = nullptr;
  int priority = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<CUresult()>> ops;
  bool running = false;
  bool stop = false;
  std::thread worker;
  // While capturing (cuStreamBeginCapture): the graph work goes into instead of running, the
  // thread that began it and its mode. Guarded by mu.
  std::unique_ptr<CUgraph_st> capture;
  std::thread::id capture_thread;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

  // Queues `op`, or adds it to the graph being captured.
  void Enqueue(std::function<CUresult()> op, const char* kind) {
    std::lock_guard<std::mutex> lock(mu);
    if (capture != nullptr) {
      capture->nodes.push_back({kind, std::move(op)});
      return;
    }
    ops.push_back(std::move(op));
    cv.notify_all();
  }
  bool Capturing() {
    std::lock_guard<std::mutex> lock(mu);
    return capture != nullptr;
  }
  bool Idle() {
    std::lock_guard<std::mutex> lock(mu);
    return ops.empty() && !running;
  }
};

struct CUkern_st;

struct CUlib_st {
  const unsigned char* image = nullptr;
  size_t size = 0;
  // The library owns its kernels, and one name is one handle, as with the real driver.
  std::mutex mu;
  std::map<std::string, std::unique_ptr<CUkern_st>> kernels;
};

struct CUmod_st {
  CUctx_st* context = nullptr;
  const std::vector<tf::HostKernel>* kernels = nullptr;
  std::atomic<bool> unloaded{false};
};

// A kernel of a library (any context), or a function of a module (its context only).
struct CUkern_st {
  const tf::HostKernel* host = nullptr;
  CUmod_st* module = nullptr;
};

namespace {

thread_local std::vector<CUctx_st*> t_current;

// Captures this thread began in a mode other than relaxed: while one is open, the thread may
// not make calls that could synchronize with the device (cuda.h, CUstreamCaptureMode).
thread_local int t_strict_captures = 0;

// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (and a misuse) when this thread has a strict capture
// open: `call` is one the driver refuses then.
CUresult NotWhileCapturing(const char* call) {
  if (t_strict_captures == 0) return CUDA_SUCCESS;
  Misuse("%s while this thread captures a stream (not permitted in that capture mode)", call);
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUctx_st* Current() { return t_current.empty() ? nullptr : t_current.back(); }

// ---- object accounting (see the top of this file) ----------------------------------------

// Counts `handle` live from now on; G().mu held.
void TrackLocked(FakeCudaKind kind, const void* handle, const CUctx_st* owner, const char* origin) {
  Global& g = G();
  g.live[handle] = Tracked{kind, owner, origin, g.generation};
  ++g.created[static_cast<size_t>(kind)];
}

void Track(FakeCudaKind kind, const void* handle, const CUctx_st* owner, const char* origin) {
  std::lock_guard<std::mutex> lock(G().mu);
  TrackLocked(kind, handle, owner, origin);
}

// Ends `handle` by its own destroy call; false when it is not a live object of `kind` (the
// caller reports the misuse). G().mu held.
bool UntrackLocked(FakeCudaKind kind, const void* handle) {
  Global& g = G();
  auto it = g.live.find(handle);
  if (it == g.live.end() || it->second.kind != kind) return false;
  g.live.erase(it);
  return true;
}

// Ends what `c` still holds as it is destroyed, each with its fate; frees pinned host memory
// and host registrations (device memory is freed by the caller). G().mu held.
void EndChildrenLocked(const CUctx_st* c) {
  Global& g = G();
  const bool faulted = c->sticky.load() != CUDA_SUCCESS;
  for (auto it = g.live.begin(); it != g.live.end();) {
    const Tracked& t = it->second;
    if (t.owner != c) {
      ++it;
      continue;
    }
    Fate fate = c->green ? Fate::kOutlivedGreenContext : Fate::kFreedWithContext;
    if (faulted && !(c->green && t.kind == FakeCudaKind::kStream)) fate = Fate::kFreedAfterFault;
    if (t.generation == g.generation) ++g.ended[{t.kind, t.origin, fate}];
    if (t.kind == FakeCudaKind::kHostMemory) {
      g.pinned.erase(reinterpret_cast<uintptr_t>(it->first));
      std::free(const_cast<void*>(it->first));
    } else if (t.kind == FakeCudaKind::kHostRegistration) {
      const auto* registration = static_cast<const HostRegistration*>(it->first);
      g.registered.erase(registration->base);
      delete registration;
    } else if (t.kind != FakeCudaKind::kDeviceMemory) {
      // Events, streams, modules...: freed with the context by the real driver; the fake's
      // struct is kept, like the context's, so that a stale handle stays recognizable and
      // LeakSanitizer sees no leak in the process under test.
      g.kept.push_back(it->first);
    }
    it = g.live.erase(it);
  }
}

// "3 streams" ("1 library", "2 libraries").
std::string Count(long n, FakeCudaKind kind) {
  std::string name = tessera::testing::FakeCudaKindName(kind);
  if (n != 1) name = name.back() == 'y' ? name.substr(0, name.size() - 1) + "ies" : name + "s";
  return std::to_string(n) + " " + name;
}

// The leak report (fake_cuda.h, FakeCudaLeaksFn): appends its lines to `text`, returns how
// many objects leaked.
long LeakReport(bool count_live, std::string& text) {
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  long leaks = 0;
  if (count_live) {
    std::map<std::pair<FakeCudaKind, std::string>, long> live;
    for (const auto& [handle, t] : g.live) {
      if (t.generation == g.generation) ++live[{t.kind, t.origin}];
    }
    for (const auto& [key, n] : live) {
      leaks += n;
      text += "fake libcuda: leak: " + Count(n, key.first) + " from " + key.second +
              " still alive (never destroyed)\n";
    }
  }
  for (const auto& [key, n] : g.ended) {
    const auto& [kind, origin, fate] = key;
    const std::string what = Count(n, kind) + " from " + origin;
    switch (fate) {
      case Fate::kFreedWithContext:
        leaks += n;
        text += "fake libcuda: leak: " + what +
                " still alive when cuCtxDestroy destroyed their context, which freed them "
                "(destroy them first)\n";
        break;
      case Fate::kOutlivedGreenContext:
        leaks += n;
        text += "fake libcuda: leak: " + what +
                " outlived their green context: cuGreenCtxDestroy frees none of them (destroy "
                "them first)\n";
        break;
      case Fate::kFreedAfterFault:
        text += "fake libcuda: note: " + what + " freed with their faulted context\n";
        break;
    }
  }
  return leaks;
}

void Fault(CUctx_st* context, CUresult error);
bool ProcessFatal(CUresult error);

// The injected failure for `call`, once its turn comes (CUDA_SUCCESS otherwise). A sticky
// error faults the current context as the real one would have been.
CUresult Injected(const char* call) {
  Global& g = G();
  CUresult error = CUDA_SUCCESS;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.fail_error == CUDA_SUCCESS || g.fail_call != call) return CUDA_SUCCESS;
    if (g.fail_after-- > 0) return CUDA_SUCCESS;
    error = g.fail_error;
    g.fail_error = CUDA_SUCCESS;
  }
  const bool sticky = ProcessFatal(error) || error == CUDA_ERROR_ECC_UNCORRECTABLE ||
                      error == CUDA_ERROR_MPS_CLIENT_TERMINATED;
  if (sticky && Current() != nullptr) Fault(Current(), error);
  return error;
}

// A process that exits with leaks says so, like a misuse (the fake is never unloaded before).
__attribute__((destructor)) void ReportLeaksAtExit() {
  std::string text;
  if (LeakReport(true, text) > 0) std::fputs(text.c_str(), stderr);
}

// The errors NVIDIA documents as leaving the process unable to use CUDA until relaunched.
bool ProcessFatal(CUresult error) {
  switch (error) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
      return true;
    default:
      return false;
  }
}

// A sticky error in `context`; a process-fatal one reaches every context of the process, and
// under MPS any fatal fault reaches every context on the device.
void Fault(CUctx_st* context, CUresult error) {
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  std::vector<CUctx_st*> hit = {context};
  const bool process = ProcessFatal(error);
  if (process && g.poisoned == CUDA_SUCCESS) g.poisoned = error;
  if (g.mps || process) {
    for (CUctx_st* c : g.contexts) {
      if ((process || c->device == context->device) && c != context) hit.push_back(c);
    }
  }
  for (CUctx_st* c : hit) {
    int expected = CUDA_SUCCESS;
    c->sticky.compare_exchange_strong(expected, error);
    if (g.mps && !c->counted_fault && !c->destroyed.load()) {
      c->counted_fault = true;
      ++g.devices[c->device].faulted_alive;
    }
  }
  for (CUctx_st* c : hit) {
    for (CUstream_st* s : c->streams) {
      std::lock_guard<std::mutex> slock(s->mu);
      s->cv.notify_all();
    }
  }
}

void Worker(CUstream_st* s) {
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->cv.wait(lock, [&] { return s->stop || !s->ops.empty(); });
    if (s->stop) return;
    if (s->context->sticky.load() != CUDA_SUCCESS) {  // a faulted stream runs nothing more
      s->ops.clear();
      s->cv.notify_all();
      continue;
    }
    std::function<CUresult()> op = std::move(s->ops.front());
    s->ops.pop_front();
    s->running = true;
    lock.unlock();
    CUresult r = op();
    if (r != CUDA_SUCCESS) Fault(s->context, r);
    lock.lock();
    s->running = false;
    s->cv.notify_all();
  }
}

// Whether [ptr, ptr + bytes) lies in one allocation of `context`.
bool Owned(CUctx_st* context, uintptr_t ptr, uint64_t bytes) {
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.allocations.upper_bound(ptr);
  if (it == g.allocations.begin()) return false;
  --it;
  return it->second.context == context && ptr + bytes <= it->first + it->second.requested;
}

CUresult CheckRange(CUctx_st* context, CUdeviceptr ptr, uint64_t bytes, const char* what) {
  if (bytes == 0 || Owned(context, static_cast<uintptr_t>(ptr), bytes)) return CUDA_SUCCESS;
  Misuse("%s: [0x%llx, +%llu) is not memory of the stream's context", what,
         static_cast<unsigned long long>(ptr), static_cast<unsigned long long>(bytes));
  return CUDA_ERROR_INVALID_VALUE;
}

// The context an API call works in; INVALID_CONTEXT (and a misuse) without one.
CUresult RequireCurrent(const char* call, CUctx_st** out) {
  CUctx_st* c = Current();
  if (c == nullptr) {
    Misuse("%s without a current context", call);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (c->destroyed.load()) {
    Misuse("%s with a destroyed context current", call);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *out = c;
  return static_cast<CUresult>(c->sticky.load());
}

CUresult StreamIn(CUstream stream, const char* call) {
  if (stream == nullptr) {
    Misuse("%s on the legacy default stream (the backend uses its own)", call);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (stream->context->destroyed.load()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return static_cast<CUresult>(stream->context->sticky.load());
}

// ---- initialization, devices -------------------------------------------------------------

std::string MpsPipeDirectory() {
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp/nvidia-mps";
}

bool MpsDaemonAlive() {
  std::ifstream in(MpsPipeDirectory() + "/nvidia-cuda-mps-control.pid");
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return false;
  return kill(static_cast<pid_t>(pid), 0) == 0;
}

// The real driver connects the process to the control daemon when CUDA is first initialized
// (MPS guide, "Client Attach/Detach"), once, and stays its client until the process exits.
// The fake announces itself to the fake daemon the same way: fake_client_<pid> in the pipe
// directory, with the CUDA_VISIBLE_DEVICES this process had (the MPS server renumbers the
// daemon's devices, so a client should have none of its own).
void ConnectToMpsDaemon() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::ofstream(MpsPipeDirectory() + "/fake_client_" + std::to_string(getpid()))
      << "CUDA_VISIBLE_DEVICES=" << (visible == nullptr ? "" : visible) << "\n";
}

CUresult Fake_cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.initialized && !g.contexts.empty()) return CUDA_SUCCESS;
  const int count = EnvInt("TESSERA_FAKE_CUDA_DEVICES", 1);
  if (count <= 0) return CUDA_ERROR_NO_DEVICE;
  g.devices.assign(static_cast<size_t>(count), Device{});
  const char* cc = std::getenv("TESSERA_FAKE_CUDA_CC");
  std::string ccs = cc == nullptr || *cc == '\0' ? "9.0" : cc;
  for (Device& d : g.devices) {
    d.sms = EnvInt("TESSERA_FAKE_CUDA_SMS", 132);
    // This device's "MAJOR[.MINOR]"; the last one given serves the devices after it.
    const std::string mine = ccs.substr(0, ccs.find(','));
    if (ccs.find(',') != std::string::npos) ccs = ccs.substr(ccs.find(',') + 1);
    d.cc_major = std::atoi(mine.c_str());
    d.cc_minor =
        mine.find('.') == std::string::npos ? 0 : std::atoi(mine.c_str() + mine.find('.') + 1);
    d.memory = static_cast<uint64_t>(EnvInt("TESSERA_FAKE_CUDA_MEMORY_MIB", 4096)) << 20;
  }
  const char* green = std::getenv("TESSERA_FAKE_CUDA_GREEN");
  g.green = green == nullptr || *green == '\0' ? "1" : green;
  const char* fault_kernel = std::getenv("TESSERA_FAKE_CUDA_FAULT_KERNEL");
  g.fault_kernel = fault_kernel == nullptr ? "" : fault_kernel;
  // The real driver decides once per process; the fake decides again on a cuInit with no
  // context alive, so that in-process tests can each bring their own daemon (or none).
  g.mps = MpsDaemonAlive();
  if (g.mps) ConnectToMpsDaemon();
  g.initialized = true;
  return CUDA_SUCCESS;
}

CUresult Fake_cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult DeviceOf(CUdevice dev, Device** out) {
  Global& g = G();
  if (!g.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || static_cast<size_t>(dev) >= g.devices.size()) return CUDA_ERROR_INVALID_DEVICE;
  *out = &g.devices[static_cast<size_t>(dev)];
  return CUDA_SUCCESS;
}

CUresult Fake_cuDeviceGetCount(int* count) {
  if (!G().initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *count = static_cast<int>(G().devices.size());
  return CUDA_SUCCESS;
}

CUresult Fake_cuDeviceGet(CUdevice* device, int ordinal) {
  Device* d = nullptr;
  if (CUresult r = DeviceOf(ordinal, &d); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult Fake_cuDeviceGetName(char* name, int len, CUdevice dev) {
  Device* d = nullptr;
  if (CUresult r = DeviceOf(dev, &d); r != CUDA_SUCCESS) return r;
  std::snprintf(name, static_cast<size_t>(len), "Tessera fake GPU %d", dev);
  return CUDA_SUCCESS;
}

CUresult Fake_cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  Device* d = nullptr;
  if (CUresult r = DeviceOf(dev, &d); r != CUDA_SUCCESS) return r;
  *bytes = d->memory;
  return CUDA_SUCCESS;
}

CUresult Fake_cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice dev) {
  Device* d = nullptr;
  if (CUresult r = DeviceOf(dev, &d); r != CUDA_SUCCESS) return r;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = d->sms;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = d->cc_major;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = d->cc_minor;
      break;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED:
      *value = G().mps ? 1 : 0;
      break;
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

// ---- contexts ------------------------------------------------------------------------------

CUresult NewContext(CUdevice dev, int sms, bool green, CUctx_st** out) {
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  if (!g.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || static_cast<size_t>(dev) >= g.devices.size()) return CUDA_ERROR_INVALID_DEVICE;
  Device& d = g.devices[static_cast<size_t>(dev)];
  if (g.poisoned != CUDA_SUCCESS) return g.poisoned;
  if (g.mps) {
    if (d.faulted_alive > 0) return CUDA_ERROR_MPS_SERVER_NOT_READY;
    if (d.mps_clients >= (d.cc_major >= 7 ? 48 : 16)) return CUDA_ERROR_MPS_MAX_CLIENTS_REACHED;
  }
  if (d.used + kContextOverhead > d.memory) return CUDA_ERROR_OUT_OF_MEMORY;
  d.used += kContextOverhead;
  if (g.mps) ++d.mps_clients;
  auto* c = new CUctx_st();
  c->device = dev;
  c->sms = sms;
  c->green = green;
  g.contexts.insert(c);
  TrackLocked(green ? FakeCudaKind::kGreenContext : FakeCudaKind::kContext, c, nullptr,
              green ? "cuGreenCtxCreate" : "cuCtxCreate");
  *out = c;
  return CUDA_SUCCESS;
}

CUresult Fake_cuCtxCreate(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                          CUdevice dev) {
  if (pctx == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Device* d = nullptr;
  if (CUresult r = DeviceOf(dev, &d); r != CUDA_SUCCESS) return r;
  int sms = d->sms;
  if (params != nullptr && params->numExecAffinityParams > 0) {
    if (!G().mps) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;  // MPS clients only
    const CUexecAffinityParam& a = params->execAffinityParams[0];
    if (a.type != CU_EXEC_AFFINITY_TYPE_SM_COUNT || a.param.smCount.val == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    sms = std::min<int>(d->sms, static_cast<int>((a.param.smCount.val + 1) / 2 * 2));
  }
  CUctx_st* c = nullptr;
  if (CUresult r = NewContext(dev, sms, false, &c); r != CUDA_SUCCESS) return r;
  t_current.push_back(c);
  *pctx = c;
  return CUDA_SUCCESS;
}

void StopStreams(CUctx_st* c) {
  for (CUstream_st* s : c->streams) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->stop = true;
      s->cv.notify_all();
    }
    if (s->worker.joinable()) s->worker.join();
  }
}

CUresult DestroyContext(CUctx_st* c) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (c->destroyed.exchange(true)) {
    Misuse("destroying a context twice");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  StopStreams(c);
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  Device& d = g.devices[static_cast<size_t>(c->device)];
  for (auto it = g.allocations.begin(); it != g.allocations.end();) {
    if (it->second.context == c) {
      d.used -= it->second.size;
      std::free(reinterpret_cast<void*>(it->first));
      it = g.allocations.erase(it);
    } else {
      ++it;
    }
  }
  d.used -= kContextOverhead;
  if (g.mps) --d.mps_clients;
  if (c->counted_fault) --d.faulted_alive;
  g.contexts.erase(c);
  UntrackLocked(c->green ? FakeCudaKind::kGreenContext : FakeCudaKind::kContext, c);
  EndChildrenLocked(c);
  for (CUctx_st*& entry : t_current) {
    if (entry == c) entry = nullptr;  // the real driver leaves such a stack entry invalid
  }
  // The struct is kept: stale handles must stay recognizable as destroyed.
  g.kept.push_back(c);
  return CUDA_SUCCESS;
}

CUresult Fake_cuCtxDestroy(CUcontext ctx) {
  if (ctx != nullptr && ctx->green) {
    Misuse("cuCtxDestroy on a green context's CUcontext (use cuGreenCtxDestroy)");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  return DestroyContext(ctx);
}

CUresult Fake_cuCtxPushCurrent(CUcontext ctx) {
  if (ctx == nullptr || ctx->destroyed.load()) {
    Misuse("pushing %s context", ctx == nullptr ? "a null" : "a destroyed");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  t_current.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult Fake_cuCtxPopCurrent(CUcontext* ctx) {
  if (t_current.empty()) {
    Misuse("cuCtxPopCurrent with no context current");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (ctx != nullptr) *ctx = t_current.back();
  t_current.pop_back();
  return CUDA_SUCCESS;
}

CUresult Fake_cuCtxGetCurrent(CUcontext* ctx) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = Current();
  return CUDA_SUCCESS;
}

CUresult Fake_cuCtxGetExecAffinity(CUexecAffinityParam* param, CUexecAffinityType type) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuCtxGetExecAffinity", &c); r != CUDA_SUCCESS) return r;
  if (type != CU_EXEC_AFFINITY_TYPE_SM_COUNT) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
  param->type = type;
  param->param.smCount.val = static_cast<unsigned int>(c->sms);
  return CUDA_SUCCESS;
}

CUresult Fake_cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuCtxGetStreamPriorityRange", &c); r != CUDA_SUCCESS) return r;
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return CUDA_SUCCESS;
}

// ---- green contexts ------------------------------------------------------------------------

// An SM resource of `sms` with the partition rules of `rules` (a device's or a split's).
void SmResource(const CUdevSmResource& rules, unsigned int sms, CUdevResource* out) {
  std::memset(out, 0, sizeof(*out));
  out->type = CU_DEV_RESOURCE_TYPE_SM;
  out->sm.smCount = sms;
  out->sm.minSmPartitionSize = rules.minSmPartitionSize;
  out->sm.smCoscheduledAlignment = rules.smCoscheduledAlignment;
}

CUresult Fake_cuDeviceGetDevResource(CUdevice dev, CUdevResource* resource,
                                     CUdevResourceType type) {
  Device* d = nullptr;
  if (CUresult r = DeviceOf(dev, &d); r != CUDA_SUCCESS) return r;
  if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  CUdevSmResource rules{};
  rules.minSmPartitionSize = d->cc_major >= 9 ? 8 : 4;
  rules.smCoscheduledAlignment = d->cc_major >= 9 ? 8 : 2;
  SmResource(rules, static_cast<unsigned int>(d->sms), resource);
  return CUDA_SUCCESS;
}

CUresult Fake_cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* groups,
                                          const CUdevResource* input, CUdevResource* remaining,
                                          unsigned int flags, unsigned int min_count) {
  if (groups == nullptr || input == nullptr || input->type != CU_DEV_RESOURCE_TYPE_SM) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (flags != 0 || min_count > input->sm.smCount) return CUDA_ERROR_INVALID_VALUE;
  const unsigned int align = input->sm.smCoscheduledAlignment;
  unsigned int count = std::max(min_count, input->sm.minSmPartitionSize);
  count = (count + align - 1) / align * align;
  if (count > input->sm.smCount) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  const unsigned int possible = input->sm.smCount / count;
  if (result == nullptr) {
    *groups = possible;
    return CUDA_SUCCESS;
  }
  *groups = std::min(*groups, possible);
  // Outputs of one split carry its serial, so that descriptors can be checked.
  static std::atomic<uint64_t> splits{0};
  const uint64_t serial = ++splits;
  for (unsigned int i = 0; i < *groups; ++i) {
    SmResource(input->sm, count, &result[i]);
    std::memcpy(result[i]._internal_padding, &serial, sizeof(serial));
  }
  if (remaining != nullptr) {
    SmResource(input->sm, input->sm.smCount - *groups * count, remaining);
    std::memcpy(remaining->_internal_padding, &serial, sizeof(serial));
  }
  return CUDA_SUCCESS;
}

CUresult Fake_cuDevResourceGenerateDesc(CUdevResourceDesc* desc, CUdevResource* resources,
                                        unsigned int count) {
  if (desc == nullptr || resources == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  unsigned int sms = 0;
  for (unsigned int i = 0; i < count; ++i) {
    if (resources[i].type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    // Several SM resources must come from the same split (the driver's documented rule).
    if (count > 1 &&
        std::memcmp(resources[i]._internal_padding, resources[0]._internal_padding, 8) != 0) {
      return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    }
    sms += resources[i].sm.smCount;
  }
  *desc = new CUdevResourceDesc_st{-1, sms};
  Keep(*desc);  // the driver owns descriptors (cuda.h has no call to free one)
  return CUDA_SUCCESS;
}

CUresult Fake_cuGreenCtxCreate(CUgreenCtx* green, CUdevResourceDesc desc, CUdevice dev,
                               unsigned int flags) {
  if (green == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_GREEN_CTX_DEFAULT_STREAM) return CUDA_ERROR_INVALID_VALUE;  // required flag
  if (G().green == "fail") return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  CUctx_st* c = nullptr;
  if (CUresult r = NewContext(dev, static_cast<int>(desc->sms), true, &c); r != CUDA_SUCCESS) {
    return r;
  }
  *green = new CUgreenCtx_st{c};  // not made current, unlike cuCtxCreate
  return CUDA_SUCCESS;
}

CUresult Fake_cuCtxFromGreenCtx(CUcontext* ctx, CUgreenCtx green) {
  if (ctx == nullptr || green == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = green->context;
  return CUDA_SUCCESS;
}

CUresult Fake_cuGreenCtxDestroy(CUgreenCtx green) {
  if (green == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = DestroyContext(green->context);
  Keep(green);  // like its context: a stale handle stays recognizable
  return r;
}

// ---- streams and events --------------------------------------------------------------------

CUresult NewStream(CUctx_st* c, unsigned int flags, int priority, const char* origin,
                   CUstream* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* s = new CUstream_st();
  s->context = c;
  s->priority = std::clamp(priority, -5, 0);
  s->worker = std::thread(Worker, s);
  {
    std::lock_guard<std::mutex> lock(G().mu);
    c->streams.push_back(s);
    TrackLocked(FakeCudaKind::kStream, s, c, origin);
  }
  *out = s;
  return CUDA_SUCCESS;
}

CUresult Fake_cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuStreamCreateWithPriority", &c); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuStreamCreateWithPriority"); r != CUDA_SUCCESS) return r;
  return NewStream(c, flags, priority, "cuStreamCreateWithPriority", stream);
}

CUresult Fake_cuGreenCtxStreamCreate(CUstream* stream, CUgreenCtx green, unsigned int flags,
                                     int priority) {
  if (green == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;  // required flag
  if (CUresult r = Injected("cuGreenCtxStreamCreate"); r != CUDA_SUCCESS) return r;
  return NewStream(green->context, flags, priority, "cuGreenCtxStreamCreate", stream);
}

CUresult Fake_cuStreamDestroy(CUstream stream) {
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (stream->context->destroyed.load()) {
    // cuda.h: after cuGreenCtxDestroy, cuStreamDestroy of its streams fails and they leak; a
    // plain context's streams went with it (the handle is stale).
    if (stream->context->green) {
      Misuse(
          "cuStreamDestroy after cuGreenCtxDestroy of the stream's green context (destroy "
          "the streams first; this one has leaked)");
      return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    Misuse("cuStreamDestroy of a stream whose context was destroyed (and freed it)");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  {
    std::lock_guard<std::mutex> lock(G().mu);
    if (!UntrackLocked(FakeCudaKind::kStream, stream)) {
      Misuse("cuStreamDestroy of a stream destroyed before");
      return CUDA_ERROR_INVALID_HANDLE;
    }
    auto& streams = stream->context->streams;
    streams.erase(std::remove(streams.begin(), streams.end(), stream), streams.end());
  }
  {
    std::unique_lock<std::mutex> lock(stream->mu);  // queued work finishes first
    stream->cv.wait(lock, [&] { return stream->ops.empty() && !stream->running; });
    stream->stop = true;
    stream->cv.notify_all();
  }
  stream->worker.join();
  Keep(stream);
  return CUDA_SUCCESS;  // the struct is kept, like a destroyed context
}

CUresult Fake_cuStreamSynchronize(CUstream stream) {
  if (CUresult r = StreamIn(stream, "cuStreamSynchronize"); r != CUDA_SUCCESS) return r;
  if (CUresult r = NotWhileCapturing("cuStreamSynchronize"); r != CUDA_SUCCESS) return r;
  if (stream->Capturing()) {
    Misuse("cuStreamSynchronize of a stream being captured");
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  std::unique_lock<std::mutex> lock(stream->mu);
  stream->cv.wait(lock, [&] {
    return (stream->ops.empty() && !stream->running) ||
           stream->context->sticky.load() != CUDA_SUCCESS || stream->stop;
  });
  return static_cast<CUresult>(stream->context->sticky.load());
}

CUresult Fake_cuStreamQuery(CUstream stream) {
  if (CUresult r = StreamIn(stream, "cuStreamQuery"); r != CUDA_SUCCESS) return r;
  if (stream->Capturing()) {
    Misuse("cuStreamQuery of a stream being captured");
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return stream->Idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult Fake_cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* data) {
  if (CUresult r = StreamIn(stream, "cuLaunchHostFunc"); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuLaunchHostFunc"); r != CUDA_SUCCESS) return r;
  stream->Enqueue(
      [fn, data] {
        fn(data);
        return CUDA_SUCCESS;
      },
      "host function");
  return CUDA_SUCCESS;
}

CUresult Fake_cuEventCreate(CUevent* event, unsigned int flags) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuEventCreate", &c); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuEventCreate"); r != CUDA_SUCCESS) return r;
  auto* e = new CUevent_st();
  e->context = c;
  e->timing = (flags & CU_EVENT_DISABLE_TIMING) == 0;
  // The flags tell the backend's events apart in the report (jobs time theirs).
  Track(FakeCudaKind::kEvent, e, c,
        e->timing ? "cuEventCreate" : "cuEventCreate(CU_EVENT_DISABLE_TIMING)");
  *event = e;
  return CUDA_SUCCESS;
}

CUresult Fake_cuEventDestroy(CUevent event) {
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard<std::mutex> lock(G().mu);
  if (!UntrackLocked(FakeCudaKind::kEvent, event)) {
    Misuse("cuEventDestroy of an event %s",
           event->context->destroyed.load() ? "whose context was destroyed" : "destroyed before");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  // The struct is kept: a stream may still be about to pass its record (the real driver
  // defers the release too).
  G().kept.push_back(event);
  return CUDA_SUCCESS;
}

CUresult Fake_cuEventRecord(CUevent event, CUstream stream) {
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = StreamIn(stream, "cuEventRecord"); r != CUDA_SUCCESS) return r;
  if (stream->Capturing()) {
    // The real driver captures it as a dependency for other streams; the fake captures one
    // stream only, and the backend records its timing events outside the capture.
    Misuse("cuEventRecord on a stream being captured (not modelled by the fake)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (event->context != stream->context) {
    Misuse("cuEventRecord: the event and the stream belong to different contexts");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (CUresult r = Injected("cuEventRecord"); r != CUDA_SUCCESS) return r;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(event->mu);
    ticket = ++event->recorded;
  }
  stream->Enqueue(
      [event, ticket] {
        std::lock_guard<std::mutex> lock(event->mu);
        event->reached = std::max(event->reached, ticket);
        event->when = Clock::now();
        event->cv.notify_all();
        return CUDA_SUCCESS;
      },
      "event record");
  return CUDA_SUCCESS;
}

CUresult Fake_cuEventQuery(CUevent event) {
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (event->context->destroyed.load()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (int sticky = event->context->sticky.load(); sticky != CUDA_SUCCESS) {
    return static_cast<CUresult>(sticky);
  }
  std::lock_guard<std::mutex> lock(event->mu);
  return event->reached == event->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult Fake_cuEventSynchronize(CUevent event) {
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = NotWhileCapturing("cuEventSynchronize"); r != CUDA_SUCCESS) return r;
  for (;;) {
    CUresult r = Fake_cuEventQuery(event);
    if (r != CUDA_ERROR_NOT_READY) return r;
    std::unique_lock<std::mutex> lock(event->mu);
    event->cv.wait_for(lock, std::chrono::milliseconds(1),
                       [&] { return event->reached == event->recorded; });
  }
}

CUresult Fake_cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!start->timing || !end->timing) return CUDA_ERROR_INVALID_HANDLE;
  for (CUevent e : {start, end}) {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->recorded == 0) return CUDA_ERROR_INVALID_HANDLE;
    if (e->reached != e->recorded) return CUDA_ERROR_NOT_READY;
  }
  std::chrono::duration<float, std::milli> d = end->when - start->when;
  *ms = std::max(d.count(), 0.0005f);
  return CUDA_SUCCESS;
}

// ---- memory --------------------------------------------------------------------------------

CUresult Fake_cuMemAlloc(CUdeviceptr* ptr, size_t bytes) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuMemAlloc", &c); r != CUDA_SUCCESS) return r;
  if (CUresult r = NotWhileCapturing("cuMemAlloc"); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuMemAlloc"); r != CUDA_SUCCESS) return r;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t size = (bytes + 255) / 256 * 256;
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  Device& d = g.devices[static_cast<size_t>(c->device)];
  if (d.used + size > d.memory) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = std::aligned_alloc(256, size + kGuardBytes);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(p, 0xA5, size);  // device memory is not zeroed
  std::memset(static_cast<char*>(p) + size, kGuardPattern, kGuardBytes);
  d.used += size;
  g.allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{size, bytes, c};
  TrackLocked(FakeCudaKind::kDeviceMemory, p, c, "cuMemAlloc");
  *ptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult Fake_cuMemFree(CUdeviceptr ptr) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuMemFree", &c); r != CUDA_SUCCESS) return r;
  if (CUresult r = NotWhileCapturing("cuMemFree"); r != CUDA_SUCCESS) return r;
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.allocations.find(static_cast<uintptr_t>(ptr));
  if (it == g.allocations.end()) {
    Misuse("cuMemFree of 0x%llx, which is not an allocation", static_cast<unsigned long long>(ptr));
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (it->second.context != c) {
    Misuse("cuMemFree of 0x%llx from another context", static_cast<unsigned long long>(ptr));
    return CUDA_ERROR_INVALID_VALUE;
  }
  const auto* guard = reinterpret_cast<const unsigned char*>(it->first + it->second.size);
  if (std::any_of(guard, guard + kGuardBytes, [](unsigned char b) { return b != kGuardPattern; })) {
    Misuse("cuMemFree of 0x%llx: something wrote past its end, into its guard zone",
           static_cast<unsigned long long>(ptr));
  }
  g.devices[static_cast<size_t>(c->device)].used -= it->second.size;
  UntrackLocked(FakeCudaKind::kDeviceMemory, reinterpret_cast<void*>(it->first));
  std::free(reinterpret_cast<void*>(it->first));
  g.allocations.erase(it);
  return CUDA_SUCCESS;
}

CUresult Fake_cuMemGetInfo(size_t* free_bytes, size_t* total) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuMemGetInfo", &c); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(G().mu);
  const Device& d = G().devices[static_cast<size_t>(c->device)];
  *free_bytes = d.memory - d.used;
  *total = d.memory;
  return CUDA_SUCCESS;
}

CUresult Fake_cuMemHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuMemHostAlloc", &c); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuMemHostAlloc"); r != CUDA_SUCCESS) return r;
  (void)flags;
  *ptr = std::malloc(std::max<size_t>(bytes, 1));
  if (*ptr == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(G().mu);
  G().pinned[reinterpret_cast<uintptr_t>(*ptr)] = std::max<size_t>(bytes, 1);
  TrackLocked(FakeCudaKind::kHostMemory, *ptr, c, "cuMemHostAlloc");
  return CUDA_SUCCESS;
}

CUresult Fake_cuMemFreeHost(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(G().mu);
    if (!UntrackLocked(FakeCudaKind::kHostMemory, ptr)) {
      Misuse(
          "cuMemFreeHost of %p, which is not live pinned memory (freed before, or with its "
          "context)",
          ptr);
      return CUDA_ERROR_INVALID_VALUE;
    }
    G().pinned.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  std::free(ptr);
  return CUDA_SUCCESS;
}

// The entry of `ranges` (by start address, with a size `SizeOf` reads) whose range holds
// `start`, or end().
template <typename Map, typename SizeOf>
typename Map::const_iterator RangeHolding(const Map& ranges, uintptr_t start, SizeOf size_of) {
  auto it = ranges.upper_bound(start);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return start - it->first < size_of(it->second) ? it : ranges.end();
}

// Whether [start, start + bytes) overlaps a range of `ranges`.
template <typename Map, typename SizeOf>
bool Overlaps(const Map& ranges, uintptr_t start, uint64_t bytes, SizeOf size_of) {
  auto next = ranges.lower_bound(start);
  if (next != ranges.end() && next->first - start < bytes) return true;
  return RangeHolding(ranges, start, size_of) != ranges.end();
}

uint64_t PinnedSize(uint64_t size) { return size; }
uint64_t RegisteredSize(const HostRegistration* r) { return r->bytes; }

CUresult Fake_cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuMemHostRegister", &c); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuMemHostRegister"); r != CUDA_SUCCESS) return r;
  constexpr unsigned int kFlags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                  CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  const auto start = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr || bytes == 0 || bytes > UINTPTR_MAX - start || (flags & ~kFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The fake's devices have neither I/O memory nor read-only registration.
  if ((flags & (CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)) != 0) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  // cuda.h: the range joins the tracking cuMemHostAlloc's memory is in, for every context.
  if (Overlaps(g.registered, start, bytes, RegisteredSize) ||
      Overlaps(g.pinned, start, bytes, PinnedSize)) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  auto* registration = new HostRegistration{
      start, bytes, c, (flags & CU_MEMHOSTREGISTER_PORTABLE) != 0, ++g.registrations};
  g.registered[start] = registration;
  TrackLocked(FakeCudaKind::kHostRegistration, registration, c, "cuMemHostRegister");
  return CUDA_SUCCESS;
}

CUresult Fake_cuMemHostUnregister(void* p) {
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuMemHostUnregister", &c); r != CUDA_SUCCESS) return r;
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.registered.find(reinterpret_cast<uintptr_t>(p));
  if (it == g.registered.end()) {
    Misuse("cuMemHostUnregister of %p, which is not the base of a registered range", p);
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  if (it->second->context != c) {
    Misuse("cuMemHostUnregister of %p from a context other than the one that registered it", p);
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  UntrackLocked(FakeCudaKind::kHostRegistration, it->second);
  delete it->second;
  g.registered.erase(it);
  return CUDA_SUCCESS;
}

// The host side of a copy on `context`'s stream: counts it by the memory [host, host + n) is
// in and returns the serial of the registration it copies directly from or to (0: none), or
// INVALID_VALUE (a misuse) for a range that starts in registered or pinned memory and runs
// past its end.
CUresult HostSide(CUctx_st* context, const void* host, uint64_t n, bool in, const char* call,
                  uint64_t* serial) {
  *serial = 0;
  if (n == 0) return CUDA_SUCCESS;
  const auto start = reinterpret_cast<uintptr_t>(host);
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  FakeCudaHostCopies& copies = g.host_copies;
  FakeCudaHostCopies::Count* count = in ? &copies.pageable_in : &copies.pageable_out;
  uint64_t base = 0, size = 0;
  const char* kind = nullptr;
  if (auto r = RangeHolding(g.registered, start, RegisteredSize); r != g.registered.end()) {
    base = r->first;
    size = r->second->bytes;
    kind = "registered";
    if (r->second->context == context || r->second->portable) {
      count = in ? &copies.direct_in : &copies.direct_out;
      *serial = r->second->serial;
    }  // else pinned for another context only: pageable for this one
  } else if (auto a = RangeHolding(g.pinned, start, PinnedSize); a != g.pinned.end()) {
    base = a->first;
    size = a->second;
    kind = "pinned";
    count = in ? &copies.staging_in : &copies.staging_out;
  }
  if (kind != nullptr && n > size - (start - base)) {
    Misuse("%s: host range [0x%llx, +%llu) runs past the end of the %s range [0x%llx, +%llu)", call,
           static_cast<unsigned long long>(start), static_cast<unsigned long long>(n), kind,
           static_cast<unsigned long long>(base), static_cast<unsigned long long>(size));
    *serial = 0;
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++count->copies;
  count->bytes += static_cast<long long>(n);
  return CUDA_SUCCESS;
}

// A direct copy's registration (HostSide's serial) must still be there when the copy runs.
void CheckStillRegistered(const void* host, uint64_t serial, const char* call) {
  if (serial == 0) return;
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  auto r = RangeHolding(g.registered, reinterpret_cast<uintptr_t>(host), RegisteredSize);
  if (r == g.registered.end() || r->second->serial != serial) {
    Misuse("%s ran after its host range %p was unregistered", call, host);
  }
}

CUresult Fake_cuMemsetD8Async(CUdeviceptr ptr, unsigned char value, size_t n, CUstream stream) {
  if (CUresult r = StreamIn(stream, "cuMemsetD8Async"); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckRange(stream->context, ptr, n, "cuMemsetD8Async"); r != CUDA_SUCCESS) {
    return r;
  }
  stream->Enqueue(
      [ptr, value, n, context = stream->context] {
        // Checked again as it runs: a graph may replay it after the memory was freed.
        if (!Owned(context, static_cast<uintptr_t>(ptr), n)) {
          DeviceError("memset: illegal address (the memory is no longer allocated)");
          return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        std::memset(reinterpret_cast<void*>(ptr), value, n);
        return CUDA_SUCCESS;
      },
      "memset");
  return CUDA_SUCCESS;
}

CUresult Fake_cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
  if (CUresult r = StreamIn(stream, "cuMemcpyHtoDAsync"); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckRange(stream->context, dst, n, "cuMemcpyHtoDAsync"); r != CUDA_SUCCESS) {
    return r;
  }
  uint64_t serial = 0;
  if (CUresult r = HostSide(stream->context, src, n, true, "cuMemcpyHtoDAsync", &serial);
      r != CUDA_SUCCESS) {
    return r;
  }
  stream->Enqueue(
      [dst, src, n, serial] {
        CheckStillRegistered(src, serial, "cuMemcpyHtoDAsync");
        std::memcpy(reinterpret_cast<void*>(dst), src, n);
        return CUDA_SUCCESS;
      },
      "memcpy");
  return CUDA_SUCCESS;
}

CUresult Fake_cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  if (CUresult r = StreamIn(stream, "cuMemcpyDtoHAsync"); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckRange(stream->context, src, n, "cuMemcpyDtoHAsync"); r != CUDA_SUCCESS) {
    return r;
  }
  uint64_t serial = 0;
  if (CUresult r = HostSide(stream->context, dst, n, false, "cuMemcpyDtoHAsync", &serial);
      r != CUDA_SUCCESS) {
    return r;
  }
  stream->Enqueue(
      [dst, src, n, serial] {
        CheckStillRegistered(dst, serial, "cuMemcpyDtoHAsync");
        std::memcpy(dst, reinterpret_cast<const void*>(src), n);
        return CUDA_SUCCESS;
      },
      "memcpy");
  return CUDA_SUCCESS;
}

CUresult Fake_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  if (CUresult r = StreamIn(stream, "cuMemcpyDtoDAsync"); r != CUDA_SUCCESS) return r;
  CUresult r = CheckRange(stream->context, dst, n, "cuMemcpyDtoDAsync (destination)");
  if (r == CUDA_SUCCESS) r = CheckRange(stream->context, src, n, "cuMemcpyDtoDAsync (source)");
  if (r != CUDA_SUCCESS) return r;
  stream->Enqueue(
      [dst, src, n, context = stream->context] {
        // Checked again as it runs: a graph may replay it after the memory was freed.
        if (!Owned(context, static_cast<uintptr_t>(dst), n) ||
            !Owned(context, static_cast<uintptr_t>(src), n)) {
          DeviceError("device-to-device copy: illegal address (the memory is no longer allocated)");
          return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
        return CUDA_SUCCESS;
      },
      "memcpy");
  return CUDA_SUCCESS;
}

// ---- libraries and kernels -----------------------------------------------------------------

CUresult Fake_cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                                unsigned int, CUlibraryOption*, void**, unsigned int) {
  if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // A fatbin: magic 0xBA55ED50, version, header size, then the size of what follows.
  uint32_t magic = 0;
  uint16_t header = 0;
  uint64_t body = 0;
  std::memcpy(&magic, code, 4);
  std::memcpy(&header, static_cast<const char*>(code) + 6, 2);
  std::memcpy(&body, static_cast<const char*>(code) + 8, 8);
  if (magic != 0xBA55ED50u) return CUDA_ERROR_INVALID_IMAGE;
  *library = new CUlib_st{static_cast<const unsigned char*>(code), header + body};
  Track(FakeCudaKind::kLibrary, *library, nullptr, "cuLibraryLoadData");
  return CUDA_SUCCESS;
}

CUresult Fake_cuLibraryUnload(CUlibrary library) {
  std::lock_guard<std::mutex> lock(G().mu);
  if (!UntrackLocked(FakeCudaKind::kLibrary, library)) {
    Misuse("cuLibraryUnload of a library that is not loaded");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  // The struct is kept, so that a stale handle never names a newer library.
  G().kept.push_back(library);
  return CUDA_SUCCESS;
}

// Loads a library kernel into the current context, as the real driver does here or at the
// context's first launch of it (lazy loading, CUDA 12.2 and later).
CUresult Fake_cuKernelGetFunction(CUfunction* function, CUkernel kernel) {
  if (function == nullptr || kernel == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuKernelGetFunction", &c); r != CUDA_SUCCESS) return r;
  {
    std::lock_guard<std::mutex> lock(G().mu);
    c->loaded_kernels.insert(kernel);
  }
  *function = reinterpret_cast<CUfunction>(kernel);
  return CUDA_SUCCESS;
}

CUresult Fake_cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  if (kernel == nullptr || library == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Present when the image's symbol tables name it (the fatbins are not compressed).
  const std::string needle = std::string(name) + '\0';
  const unsigned char* end = library->image + library->size;
  auto it = std::search(library->image, end, needle.begin(), needle.end());
  if (it == end) return CUDA_ERROR_NOT_FOUND;
  std::string error;
  const tf::HostKernel* host = tf::FindHostKernel(name, &error);
  if (host == nullptr) {  // in the image but not built for the host: tests/CMakeLists.txt
    Misuse("kernel %s has no host build in the fake driver%s%s", name, error.empty() ? "" : ": ",
           error.c_str());
    return CUDA_ERROR_NOT_FOUND;
  }
  std::lock_guard<std::mutex> lock(library->mu);
  std::unique_ptr<CUkern_st>& owned = library->kernels[name];
  if (owned == nullptr) owned.reset(new CUkern_st{host});
  *kernel = owned.get();
  return CUDA_SUCCESS;
}

// A module of a generated kernel (a tenant-defined kernel) as the fake's kernel compiler
// (fake_kernel_compiler.cc) builds it: kFakeModuleMagic, then the path of a shared object of
// its host build. Anything else (a real cubin or PTX) cannot run here.
constexpr char kFakeModuleMagic[] = "TESSERA-FAKE-HOST-MODULE\n";

CUresult Fake_cuModuleLoadData(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuModuleLoadData", &c); r != CUDA_SUCCESS) return r;
  const char* text = static_cast<const char*>(image);
  const size_t magic = sizeof(kFakeModuleMagic) - 1;
  if (std::strncmp(text, kFakeModuleMagic, magic) != 0) {
    Misuse(
        "cuModuleLoadData of an image that is not the fake kernel compiler's (a real cubin or "
        "PTX cannot run on the fake driver; set TESSERA_KERNEL_COMPILER to "
        "tessera-fake-kernel-compiler)");
    return CUDA_ERROR_INVALID_IMAGE;
  }
  std::string path(text + magic);
  path = path.substr(0, path.find('\n'));
  std::string error;
  const std::vector<tf::HostKernel>* kernels = tf::LoadHostModule(path, &error);
  if (kernels == nullptr) {
    std::fprintf(stderr, "fake libcuda: cannot load the module %s: %s\n", path.c_str(),
                 error.c_str());
    return CUDA_ERROR_INVALID_IMAGE;
  }
  auto* m = new CUmod_st();
  m->context = c;
  m->kernels = kernels;
  Track(FakeCudaKind::kModule, m, c, "cuModuleLoadData");
  *module = m;
  return CUDA_SUCCESS;
}

CUresult Fake_cuModuleUnload(CUmodule module) {
  CUctx_st* c = Current();
  if (module != nullptr && c != module->context) {
    Misuse("cuModuleUnload of a module of a context that is not current");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  std::lock_guard<std::mutex> lock(G().mu);
  if (module == nullptr || !UntrackLocked(FakeCudaKind::kModule, module)) {
    Misuse("cuModuleUnload of a module that is not loaded");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  module->unloaded = true;  // the struct is kept: stale functions stay recognizable
  G().kept.push_back(module);
  return CUDA_SUCCESS;
}

CUresult Fake_cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  if (function == nullptr || module == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (module->unloaded.load()) {
    Misuse("cuModuleGetFunction on an unloaded module");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  for (const tf::HostKernel& k : *module->kernels) {
    if (std::strcmp(k.name, name) == 0) {
      *function = reinterpret_cast<CUfunction>(new CUkern_st{&k, module});
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}

// A launch runs the kernel's host build (host_kernels.h, device_runtime.cc) on the stream,
// with copies of its parameters taken now, as the driver takes them.
CUresult Fake_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                             CUstream stream, void** params, void** extra) {
  if (f == nullptr || extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = StreamIn(stream, "cuLaunchKernel"); r != CUDA_SUCCESS) return r;
  if (Current() != stream->context) {
    Misuse("cuLaunchKernel on a stream of a context that is not current");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  const tf::HostKernel* kernel = reinterpret_cast<CUkern_st*>(f)->host;
  const char* name = kernel->name;
  if (const CUmod_st* m = reinterpret_cast<CUkern_st*>(f)->module; m != nullptr) {
    if (m->unloaded.load()) {
      Misuse("%s launched after its module was unloaded", name);
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (m->context != stream->context) {
      Misuse("%s launched in a context other than its module's", name);
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
  // The limits of compute capability 8.0 and 9.0 (CUDA C++ Programming Guide).
  if (gx == 0 || gy == 0 || gz == 0 || gx > 0x7fffffffu || gy > 65535 || gz > 65535 || bx == 0 ||
      by == 0 || bz == 0 || bx > 1024 || by > 1024 || bz > 64 || uint64_t{bx} * by * bz > 1024) {
    Misuse("%s launched with grid %ux%ux%u and block %ux%ux%u", name, gx, gy, gz, bx, by, bz);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (shmem != 0) {  // the kernels have only static shared memory (device.h)
    Misuse("%s launched with %u bytes of dynamic shared memory", name, shmem);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (kernel->params > 0 && params == nullptr) {
    Misuse("%s launched without its %d parameters", name, kernel->params);
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The parameters, copied now, each at its alignment.
  struct Launch {
    std::vector<std::max_align_t> storage;
    std::vector<void*> pointers;
  };
  auto launch = std::make_shared<Launch>();
  size_t bytes = 0;
  std::vector<size_t> offsets;
  for (int i = 0; i < kernel->params; ++i) {
    const size_t align = kernel->alignments[static_cast<size_t>(i)];
    bytes = (bytes + align - 1) / align * align;
    offsets.push_back(bytes);
    bytes += kernel->sizes[static_cast<size_t>(i)];
  }
  launch->storage.resize(bytes / sizeof(std::max_align_t) + 1);
  auto* base = reinterpret_cast<char*>(launch->storage.data());
  for (int i = 0; i < kernel->params; ++i) {
    std::memcpy(base + offsets[static_cast<size_t>(i)], params[i],
                kernel->sizes[static_cast<size_t>(i)]);
    launch->pointers.push_back(base + offsets[static_cast<size_t>(i)]);
  }
  CUctx_st* context = stream->context;
  const dim3 grid(gx, gy, gz), block(bx, by, bz);
  // A library kernel not yet loaded into this context is loaded now, and, as NVIDIA's notes
  // on lazy loading warn and an H100 showed (1.9 s behind a tenant's long program), the load
  // waits for the work already queued in the context: every one of its streams.
  if (reinterpret_cast<CUkern_st*>(f)->module == nullptr) {
    bool loaded = false;
    std::vector<CUstream_st*> streams;
    {
      std::lock_guard<std::mutex> lock(G().mu);
      loaded = !context->loaded_kernels.insert(f).second;
      if (!loaded) streams = context->streams;
    }
    if (!loaded) {
      for (CUstream_st* other : streams) {
        std::unique_lock<std::mutex> lock(other->mu);
        other->cv.wait(lock, [&] {
          return (other->ops.empty() && !other->running) ||
                 context->sticky.load() != CUDA_SUCCESS || other->stop;
        });
      }
    }
  }
  if (!G().fault_kernel.empty() && G().fault_kernel == name) {
    stream->Enqueue(
        [name] {
          DeviceError(std::string("kernel ") + name +
                      ": illegal address (TESSERA_FAKE_CUDA_FAULT_KERNEL)");
          return CUDA_ERROR_ILLEGAL_ADDRESS;
        },
        name);
    return CUDA_SUCCESS;
  }
  stream->Enqueue(
      [kernel, launch, context, grid, block] {
        std::vector<tf::DeviceRange> memory;
        {
          std::lock_guard<std::mutex> lock(G().mu);
          memory.reserve(G().allocations.size());
          for (const auto& [address, a] : G().allocations) {
            memory.push_back({address, a.requested, a.size + kGuardBytes, a.context});
          }
        }
        std::string message;
        const int error = tf::RunHostKernel(*kernel, grid, block, launch->pointers.data(), memory,
                                            context, &message);
        if (error != CUDA_SUCCESS) DeviceError(message);
        return static_cast<CUresult>(error);
      },
      name);
  return CUDA_SUCCESS;
}

// ---- errors and the entry-point table ------------------------------------------------------

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
     "the provided execution affinity is not supported"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_MPS_SERVER_NOT_READY, "CUDA_ERROR_MPS_SERVER_NOT_READY",
     "MPS client failed to connect to the MPS control daemon or the MPS server"},
    {CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
     "the hardware resources required to create MPS client have been exhausted"},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type"},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
     "invalid resource configuration"},
};

// ---- graphs: stream capture, instantiation, launch, update ------------------------------

CUresult Fake_cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode) {
  if (CUresult r = StreamIn(stream, "cuStreamBeginCapture"); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuStreamBeginCapture"); r != CUDA_SUCCESS) return r;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  {
    std::lock_guard<std::mutex> lock(stream->mu);
    if (stream->capture != nullptr) {
      Misuse("cuStreamBeginCapture of a stream already being captured");
      return CUDA_ERROR_ILLEGAL_STATE;
    }
    stream->capture = std::make_unique<CUgraph_st>();
    stream->capture->context = stream->context;
    stream->capture_thread = std::this_thread::get_id();
    stream->capture_mode = mode;
  }
  if (mode != CU_STREAM_CAPTURE_MODE_RELAXED) ++t_strict_captures;
  return CUDA_SUCCESS;
}

CUresult Fake_cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::unique_ptr<CUgraph_st> captured;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  {
    std::lock_guard<std::mutex> lock(stream->mu);
    if (stream->capture == nullptr) {
      Misuse("cuStreamEndCapture of a stream not being captured");
      return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (stream->capture_thread != std::this_thread::get_id() &&
        stream->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      Misuse("cuStreamEndCapture from a thread other than the one that began the capture");
      return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    captured = std::move(stream->capture);
    mode = stream->capture_mode;
  }
  if (mode != CU_STREAM_CAPTURE_MODE_RELAXED) --t_strict_captures;
  *graph = captured.release();
  Track(FakeCudaKind::kGraph, *graph, nullptr, "cuStreamEndCapture");
  return CUDA_SUCCESS;
}

CUresult Fake_cuGraphDestroy(CUgraph graph) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard<std::mutex> lock(G().mu);
    if (!UntrackLocked(FakeCudaKind::kGraph, graph)) {
      Misuse("cuGraphDestroy of a graph destroyed before (or never made)");
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  delete graph;  // its nodes' data (a cuBLAS call's) go with the last graph holding them
  return CUDA_SUCCESS;
}

CUresult Fake_cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                          unsigned long long flags) {
  if (exec == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;  // the backend asks for none
  CUctx_st* c = nullptr;
  if (CUresult r = RequireCurrent("cuGraphInstantiateWithFlags", &c); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuGraphInstantiateWithFlags"); r != CUDA_SUCCESS) return r;
  if (c != graph->context) {
    Misuse("cuGraphInstantiateWithFlags in a context other than the one the graph's work is in");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  auto* e = new CUgraphExec_st{c, graph->nodes};
  Track(FakeCudaKind::kGraphExec, e, c, "cuGraphInstantiateWithFlags");
  *exec = e;
  return CUDA_SUCCESS;
}

CUresult Fake_cuGraphExecDestroy(CUgraphExec exec) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (exec->context->destroyed.load()) {
    Misuse("cuGraphExecDestroy after its context was destroyed (and freed it)");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  {
    std::lock_guard<std::mutex> lock(G().mu);
    if (!UntrackLocked(FakeCudaKind::kGraphExec, exec)) {
      Misuse("cuGraphExecDestroy of an executable graph destroyed before");
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  exec->nodes.clear();  // the struct is kept, like a destroyed stream's
  Keep(exec);
  return CUDA_SUCCESS;
}

CUresult Fake_cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = StreamIn(stream, "cuGraphLaunch"); r != CUDA_SUCCESS) return r;
  if (CUresult r = Injected("cuGraphLaunch"); r != CUDA_SUCCESS) return r;
  if (exec->context != stream->context) {
    Misuse("cuGraphLaunch on a stream of another context than the graph's");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (stream->Capturing()) {
    Misuse("cuGraphLaunch into a stream being captured (not modelled by the fake)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // The nodes as they are now: a later update changes the next launch, not this one.
  stream->Enqueue(
      [nodes = exec->nodes] {
        for (const GraphNode& node : nodes) {
          if (CUresult r = node.run(); r != CUDA_SUCCESS) return r;
        }
        return CUDA_SUCCESS;
      },
      "graph");
  return CUDA_SUCCESS;
}

// Takes `graph`'s node parameters into `exec` when both have the same nodes in the same order
// (kernels: the same function); otherwise CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE with the
// reason, and `exec` unchanged.
CUresult Fake_cuGraphExecUpdate(CUgraphExec exec, CUgraph graph,
                                CUgraphExecUpdateResultInfo* info) {
  if (exec == nullptr || graph == nullptr || info == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = Injected("cuGraphExecUpdate"); r != CUDA_SUCCESS) return r;
  *info = CUgraphExecUpdateResultInfo{};
  if (graph->context != exec->context) {
    info->result = CU_GRAPH_EXEC_UPDATE_ERROR;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  if (graph->nodes.size() != exec->nodes.size()) {
    info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  for (size_t i = 0; i < graph->nodes.size(); ++i) {
    if (graph->nodes[i].kind != exec->nodes[i].kind) {
      info->result = graph->nodes[i].kind.find(' ') == std::string::npos &&
                             exec->nodes[i].kind.find(' ') == std::string::npos
                         ? CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED
                         : CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
  }
  exec->nodes = graph->nodes;
  info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return CUDA_SUCCESS;
}

CUresult Fake_cuGetErrorName(CUresult error, const char** name) {
  for (const ErrorText& e : kErrors) {
    if (e.code == error) {
      *name = e.name;
      return CUDA_SUCCESS;
    }
  }
  *name = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult Fake_cuGetErrorString(CUresult error, const char** text) {
  for (const ErrorText& e : kErrors) {
    if (e.code == error) {
      *text = e.text;
      return CUDA_SUCCESS;
    }
  }
  *text = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

struct Entry {
  const char* name;
  void* fn;
  bool green;
  std::atomic<long>* calls;  // since the last reset
};

// What cuGetProcAddress hands out: the fake, behind a counter of its calls (per entry point,
// so that a test can count the driver calls a job makes; tessera_fake_cuda_calls).
template <auto Fn>
struct Counted;
template <typename R, typename... Args, R (*Fn)(Args...)>
struct Counted<Fn> {
  static inline std::atomic<long> calls{0};
  static R Call(Args... args) {
    calls.fetch_add(1, std::memory_order_relaxed);
    return Fn(args...);
  }
};

// Each fake is checked against the CUDA 13 prototype it stands for. (`name` is pasted, never
// passed on to another macro: cuda.h defines some names as macros of their versioned ones.)
#define FAKE_ENTRY(name)                                                                           \
  Entry {                                                                                          \
#name,                                                                                         \
        reinterpret_cast < void*>(&Counted <static_cast <decltype(&::name)>(&Fake_##name)>::Call), \
        false, &Counted < static_cast < decltype(&::name)>(&Fake_##name)> ::calls                  \
  }
#define FAKE_GREEN(name)                                                                           \
  Entry {                                                                                          \
#name,                                                                                         \
        reinterpret_cast < void*>(&Counted <static_cast <decltype(&::name)>(&Fake_##name)>::Call), \
        true, &Counted < static_cast < decltype(&::name)>(&Fake_##name)> ::calls                   \
  }

const std::vector<Entry>& Entries() {
  static const std::vector<Entry> entries = {
      FAKE_ENTRY(cuInit),
      FAKE_ENTRY(cuDriverGetVersion),
      FAKE_ENTRY(cuDeviceGetCount),
      FAKE_ENTRY(cuDeviceGet),
      FAKE_ENTRY(cuDeviceGetName),
      FAKE_ENTRY(cuDeviceTotalMem),
      FAKE_ENTRY(cuDeviceGetAttribute),
      FAKE_ENTRY(cuCtxCreate),
      FAKE_ENTRY(cuCtxDestroy),
      FAKE_ENTRY(cuCtxPushCurrent),
      FAKE_ENTRY(cuCtxPopCurrent),
      FAKE_ENTRY(cuCtxGetCurrent),
      FAKE_ENTRY(cuCtxGetExecAffinity),
      FAKE_ENTRY(cuCtxGetStreamPriorityRange),
      FAKE_ENTRY(cuMemAlloc),
      FAKE_ENTRY(cuMemFree),
      FAKE_ENTRY(cuMemsetD8Async),
      FAKE_ENTRY(cuMemcpyHtoDAsync),
      FAKE_ENTRY(cuMemcpyDtoHAsync),
      FAKE_ENTRY(cuMemcpyDtoDAsync),
      FAKE_ENTRY(cuMemHostAlloc),
      FAKE_ENTRY(cuMemFreeHost),
      FAKE_ENTRY(cuMemHostRegister),
      FAKE_ENTRY(cuMemHostUnregister),
      FAKE_ENTRY(cuMemGetInfo),
      FAKE_ENTRY(cuStreamCreateWithPriority),
      FAKE_ENTRY(cuStreamDestroy),
      FAKE_ENTRY(cuStreamSynchronize),
      FAKE_ENTRY(cuStreamQuery),
      FAKE_ENTRY(cuLaunchHostFunc),
      FAKE_ENTRY(cuLaunchKernel),
      FAKE_ENTRY(cuEventCreate),
      FAKE_ENTRY(cuEventDestroy),
      FAKE_ENTRY(cuEventRecord),
      FAKE_ENTRY(cuEventQuery),
      FAKE_ENTRY(cuEventSynchronize),
      FAKE_ENTRY(cuEventElapsedTime),
      FAKE_ENTRY(cuLibraryLoadData),
      FAKE_ENTRY(cuLibraryUnload),
      FAKE_ENTRY(cuLibraryGetKernel),
      FAKE_ENTRY(cuKernelGetFunction),
      FAKE_ENTRY(cuModuleLoadData),
      FAKE_ENTRY(cuModuleUnload),
      FAKE_ENTRY(cuModuleGetFunction),
      FAKE_ENTRY(cuGetErrorName),
      FAKE_ENTRY(cuGetErrorString),
      FAKE_ENTRY(cuStreamBeginCapture),
      FAKE_ENTRY(cuStreamEndCapture),
      FAKE_ENTRY(cuGraphDestroy),
      FAKE_ENTRY(cuGraphInstantiateWithFlags),
      FAKE_ENTRY(cuGraphExecDestroy),
      FAKE_ENTRY(cuGraphLaunch),
      FAKE_ENTRY(cuGraphExecUpdate),
      FAKE_GREEN(cuDeviceGetDevResource),
      FAKE_GREEN(cuDevSmResourceSplitByCount),
      FAKE_GREEN(cuDevResourceGenerateDesc),
      FAKE_GREEN(cuGreenCtxCreate),
      FAKE_GREEN(cuGreenCtxDestroy),
      FAKE_GREEN(cuCtxFromGreenCtx),
      FAKE_GREEN(cuGreenCtxStreamCreate),
  };
  return entries;
}

}  // namespace

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  (void)flags;
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (version < kDriverVersion) {  // this fake serves the CUDA 13 variants only
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  const char* green = std::getenv("TESSERA_FAKE_CUDA_GREEN");
  const bool no_green = green != nullptr && std::strcmp(green, "0") == 0;
  for (const Entry& e : Entries()) {
    if (std::strcmp(e.name, symbol) != 0 || (e.green && no_green)) continue;
    *pfn = e.fn;
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_FOUND;
}

FAKE_EXPORT CUresult cuDriverGetVersion(int* version) { return Fake_cuDriverGetVersion(version); }

// The test interface (tests/fake_cuda/driver/fake_cuda.h says what each returns).

FAKE_EXPORT int tessera_fake_cuda_misuses() { return g_misuses.load(); }

FAKE_EXPORT bool tessera_fake_cuda_tally(int kind, FakeCudaTally* out) {
  if (kind < 0 || kind >= tessera::testing::kFakeCudaKinds || out == nullptr) return false;
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  *out = FakeCudaTally{};
  out->created = g.created[static_cast<size_t>(kind)];
  for (const auto& [handle, t] : g.live) {
    if (static_cast<int>(t.kind) == kind && t.generation == g.generation) ++out->live;
  }
  for (const auto& [key, n] : g.ended) {
    const auto& [k, origin, fate] = key;
    if (static_cast<int>(k) != kind) continue;
    switch (fate) {
      case Fate::kFreedWithContext:
        out->freed_with_context += n;
        break;
      case Fate::kOutlivedGreenContext:
        out->outlived_green_context += n;
        break;
      case Fate::kFreedAfterFault:
        out->freed_after_fault += n;
        break;
    }
  }
  return true;
}

FAKE_EXPORT int tessera_fake_cuda_leaks(int count_live, char* text, int size) {
  std::string report;
  const long leaks = LeakReport(count_live != 0, report);
  if (text != nullptr && size > 0) {
    std::snprintf(text, static_cast<size_t>(size), "%s", report.c_str());
  }
  return static_cast<int>(leaks);
}

FAKE_EXPORT void tessera_fake_cuda_reset() {
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  ++g.generation;
  g.created.fill(0);
  g.ended.clear();
  g.fail_error = CUDA_SUCCESS;
  g.poisoned = CUDA_SUCCESS;  // a new process, as far as the next contexts are concerned
  g.host_copies = FakeCudaHostCopies{};
  g_misuses.store(0);
  for (const Entry& e : Entries()) e.calls->store(0);
  std::lock_guard<std::mutex> device_lock(g_device_error_mu);
  g_device_errors = 0;
  g_device_error.clear();
}

FAKE_EXPORT long tessera_fake_cuda_calls(char* text, int size) {
  std::string report;
  long total = 0;
  for (const Entry& e : Entries()) {
    const long n = e.calls->load();
    if (n == 0) continue;
    total += n;
    report += std::string(e.name) + " " + std::to_string(n) + "\n";
  }
  if (text != nullptr && size > 0) {
    std::snprintf(text, static_cast<size_t>(size), "%s", report.c_str());
  }
  return total;
}

FAKE_EXPORT void tessera_fake_cuda_new_process() {
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  g.poisoned = CUDA_SUCCESS;
}

FAKE_EXPORT void tessera_fake_cuda_host_copies(FakeCudaHostCopies* out) {
  if (out == nullptr) return;
  std::lock_guard<std::mutex> lock(G().mu);
  *out = G().host_copies;
}

FAKE_EXPORT int tessera_fake_cuda_device_errors(char* last, int size) {
  std::lock_guard<std::mutex> lock(g_device_error_mu);
  if (last != nullptr && size > 0) {
    std::snprintf(last, static_cast<size_t>(size), "%s", g_device_error.c_str());
  }
  return g_device_errors;
}

FAKE_EXPORT void tessera_fake_cuda_fail(const char* call, int after, int error) {
  Global& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  g.fail_call = call == nullptr ? "" : call;
  g.fail_after = after;
  g.fail_error = static_cast<CUresult>(error);
}

// For the fake cuBLAS (fake_cublas.cc), which works on this driver's streams and memory.

FAKE_EXPORT int tessera_fake_cuda_stream_context(CUstream stream, CUcontext* out) {
  if (stream == nullptr || out == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *out = stream->context;
  return CUDA_SUCCESS;
}

FAKE_EXPORT int tessera_fake_cuda_enqueue(CUstream stream, int (*op)(void*), void* data,
                                          void (*release)(void*)) {
  std::shared_ptr<void> held(data, release);
  if (CUresult r = StreamIn(stream, "tessera_fake_cuda_enqueue"); r != CUDA_SUCCESS) return r;
  stream->Enqueue([op, held] { return static_cast<CUresult>(op(held.get())); }, "cublas");
  return CUDA_SUCCESS;
}

FAKE_EXPORT int tessera_fake_cuda_check_range(CUstream stream, unsigned long long ptr,
                                              unsigned long long bytes, char* why, int size) {
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (bytes == 0 || Owned(stream->context, static_cast<uintptr_t>(ptr), bytes)) {
    return CUDA_SUCCESS;
  }
  if (why != nullptr && size > 0) {
    std::snprintf(why, static_cast<size_t>(size),
                  "[0x%llx, +%llu) is not inside one allocation of the stream's context", ptr,
                  bytes);
  }
  return CUDA_ERROR_ILLEGAL_ADDRESS;
}
