#ifndef TESSERA_TESTS_FAKE_CUDA_DRIVER_FAKE_CUDA_H_
#define TESSERA_TESTS_FAKE_CUDA_DRIVER_FAKE_CUDA_H_

// What the fake driver (fake_cuda.cc) exports besides the CUDA entry points, and a reader for
// tests: its misuse count, its accounting of the objects it hands out (see "Object
// accounting" in fake_cuda.cc) and its count of host<->device copies by host memory kind.
// Plain C++ and <dlfcn.h> only, so that tests reach it without CUDA headers and on hosts
// where libcuda.so.1 is NVIDIA's (then FakeCudaDriver::Loaded() is empty).
#include <array>
#include <optional>
#include <string>
#include <utility>

#include <dlfcn.h>

namespace tessera::testing {

/// The kinds of object the fake driver counts, with the calls that make them.
enum class FakeCudaKind : int {
  kContext = 0,       // cuCtxCreate
  kGreenContext,      // cuGreenCtxCreate
  kStream,            // cuStreamCreateWithPriority, cuGreenCtxStreamCreate
  kEvent,             // cuEventCreate
  kDeviceMemory,      // cuMemAlloc
  kHostMemory,        // cuMemHostAlloc (pinned)
  kLibrary,           // cuLibraryLoadData
  kModule,            // cuModuleLoadData (in the current context)
  kHostRegistration,  // cuMemHostRegister (in the current context)
  kGraph,             // cuStreamEndCapture (a captured graph; no context of its own)
  kGraphExec,         // cuGraphInstantiateWithFlags (in the graph's context)
};
inline constexpr int kFakeCudaKinds = 11;

/// "stream" (the report's word for a kind).
inline const char* FakeCudaKindName(FakeCudaKind kind) {
  static constexpr std::array<const char*, kFakeCudaKinds> kNames = {
      "context",
      "green context",
      "stream",
      "event",
      "device allocation",
      "pinned host allocation",
      "library",
      "module",
      "host registration",
      "graph",
      "executable graph",
  };
  return kNames[static_cast<size_t>(kind)];
}

/// What became of the objects of one kind made since the last reset. Every object made is
/// live, destroyed by its own call (not counted here), or in exactly one of the last three.
struct FakeCudaTally {
  long created = 0;
  /// Not destroyed yet, and neither is whatever would free it.
  long live = 0;
  /// Alive when cuCtxDestroy destroyed their healthy context: freed with it, as CUDA does,
  /// but the caller had forgotten them. A leak for the tests.
  long freed_with_context = 0;
  /// Alive when cuGreenCtxDestroy destroyed their green context, which frees none of them
  /// (streams never; memory and events belong to the device's primary context). A leak.
  long outlived_green_context = 0;
  /// Alive when their context, faulted by a sticky error, was destroyed: the recovery CUDA
  /// documents (streams of green contexts excepted: those must be destroyed even then, and
  /// count as outlived_green_context). Not a leak.
  long freed_after_fault = 0;
};

/// Host<->device copies since the last reset, by the host memory they used: "in" is
/// cuMemcpyHtoDAsync, "out" cuMemcpyDtoHAsync; counted when the copy is issued.
struct FakeCudaHostCopies {
  struct Count {
    long copies = 0;
    long long bytes = 0;
  };
  /// Inside a range the stream's context registered with cuMemHostRegister (or any context
  /// with CU_MEMHOSTREGISTER_PORTABLE): one DMA from the caller's memory.
  Count direct_in, direct_out;
  /// Inside cuMemHostAlloc'd pinned memory: the backend's staging buffers.
  Count staging_in, staging_out;
  /// Anything else: pageable memory (the real driver stages it itself).
  Count pageable_in, pageable_out;
};

// The exported functions, by name.
inline constexpr char kFakeCudaMisusesSymbol[] = "tessera_fake_cuda_misuses";
inline constexpr char kFakeCudaTallySymbol[] = "tessera_fake_cuda_tally";
inline constexpr char kFakeCudaLeaksSymbol[] = "tessera_fake_cuda_leaks";
inline constexpr char kFakeCudaResetSymbol[] = "tessera_fake_cuda_reset";
inline constexpr char kFakeCudaFailSymbol[] = "tessera_fake_cuda_fail";
inline constexpr char kFakeCudaDeviceErrorsSymbol[] = "tessera_fake_cuda_device_errors";
inline constexpr char kFakeCudaNewProcessSymbol[] = "tessera_fake_cuda_new_process";
inline constexpr char kFakeCudaHostCopiesSymbol[] = "tessera_fake_cuda_host_copies";
inline constexpr char kFakeCudaCallsSymbol[] = "tessera_fake_cuda_calls";
/// Misuses since the last reset.
using FakeCudaMisusesFn = int (*)();
/// Fills `*out` for `kind` (a FakeCudaKind); false for another number.
using FakeCudaTallyFn = bool (*)(int kind, FakeCudaTally* out);
/// Leaked objects since the last reset: those that outlived a healthy context (both kinds
/// above) plus, if `count_live`, those still live. Writes one "fake libcuda: leak: ..." line
/// per kind, origin and fate (and "fake libcuda: note: ..." lines for objects freed after a
/// fault) to `text`, truncated to `size` bytes with a terminating NUL; `text` may be null.
using FakeCudaLeaksFn = int (*)(int count_live, char* text, int size);
/// Forgets the misuses, the objects counted so far (objects made before it never count) and
/// an injected failure not reached yet, so that each of several tests in one process sees
/// only its own.
using FakeCudaResetFn = void (*)();
/// Makes the call of entry point `call` after `after` more that succeed fail with CUresult
/// `error`, once. Served for the calls that create an object or finish a job's submission:
/// cuStreamCreateWithPriority, cuGreenCtxStreamCreate, cuEventCreate, cuEventRecord,
/// cuLaunchHostFunc, cuMemAlloc, cuMemHostAlloc, cuMemHostRegister.
using FakeCudaFailFn = void (*)(const char* call, int after, int error);
/// Kernel faults since the last reset (an access outside the launching context's memory, a
/// misaligned one, a misused barrier or warp intrinsic); the last one's description ("kernel
/// K, block (x,y,z), thread (x,y,z): ...") in `last`, truncated to `size` bytes.
using FakeCudaDeviceErrorsFn = int (*)(char* last, int size);
/// Forgets a process-fatal error (an illegal address and the like: after one, no context can
/// be created in the process), as a new process would; the counts stay. Reset does it too.
using FakeCudaNewProcessFn = void (*)();
/// Fills `*out` with the host copies counted since the last reset.
using FakeCudaHostCopiesFn = void (*)(FakeCudaHostCopies* out);
/// Driver calls (through the entry points cuGetProcAddress handed out) since the last reset;
/// one "name count" line per entry point called to `text`, truncated to `size` bytes.
using FakeCudaCallsFn = long (*)(char* text, int size);

// For the fake cuBLAS (fake_cublas.cc), declared there with the driver's types:
//   int tessera_fake_cuda_stream_context(CUstream, CUcontext* out)
//       the context a stream belongs to.
//   int tessera_fake_cuda_enqueue(CUstream, int (*op)(void*), void* data,
//                                 void (*release)(void*))
//       runs op(data) on the stream in order; a nonzero CUresult it returns is a sticky
//       fault of the stream's context, like a kernel's. release(data) once the operation is
//       done with: after it ran, or, captured into a graph, when the last graph holding it
//       goes (a graph may run it many times).
//   int tessera_fake_cuda_check_range(CUstream, unsigned long long ptr,
//                                     unsigned long long bytes, char* why, int size)
//       CUDA_SUCCESS when [ptr, ptr + bytes) lies inside one allocation (the size requested)
//       of the stream's context; else CUDA_ERROR_ILLEGAL_ADDRESS and the reason in `why`.

/// The fake driver as loaded in this process. Thread-safe; the fake stays loaded for the
/// process's life (it is linked -z nodelete), so the reader may outlive every other handle.
class FakeCudaDriver {
 public:
  /// The fake, if the libcuda.so.1 loaded in this process is the fake driver; empty when none
  /// is loaded or it is NVIDIA's.
  static std::optional<FakeCudaDriver> Loaded() {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) return std::nullopt;
    FakeCudaDriver fake(handle);
    fake.misuses_ = reinterpret_cast<FakeCudaMisusesFn>(dlsym(handle, kFakeCudaMisusesSymbol));
    fake.tally_ = reinterpret_cast<FakeCudaTallyFn>(dlsym(handle, kFakeCudaTallySymbol));
    fake.leaks_ = reinterpret_cast<FakeCudaLeaksFn>(dlsym(handle, kFakeCudaLeaksSymbol));
    fake.reset_ = reinterpret_cast<FakeCudaResetFn>(dlsym(handle, kFakeCudaResetSymbol));
    fake.fail_ = reinterpret_cast<FakeCudaFailFn>(dlsym(handle, kFakeCudaFailSymbol));
    fake.device_errors_ =
        reinterpret_cast<FakeCudaDeviceErrorsFn>(dlsym(handle, kFakeCudaDeviceErrorsSymbol));
    fake.new_process_ =
        reinterpret_cast<FakeCudaNewProcessFn>(dlsym(handle, kFakeCudaNewProcessSymbol));
    fake.host_copies_ =
        reinterpret_cast<FakeCudaHostCopiesFn>(dlsym(handle, kFakeCudaHostCopiesSymbol));
    fake.calls_ = reinterpret_cast<FakeCudaCallsFn>(dlsym(handle, kFakeCudaCallsSymbol));
    if (fake.misuses_ == nullptr || fake.tally_ == nullptr || fake.leaks_ == nullptr ||
        fake.reset_ == nullptr || fake.fail_ == nullptr || fake.device_errors_ == nullptr ||
        fake.new_process_ == nullptr || fake.host_copies_ == nullptr || fake.calls_ == nullptr) {
      return std::nullopt;
    }
    return fake;
  }

  FakeCudaDriver(FakeCudaDriver&& other) noexcept { *this = std::move(other); }
  FakeCudaDriver& operator=(FakeCudaDriver&& other) noexcept {
    std::swap(handle_, other.handle_);
    misuses_ = other.misuses_;
    tally_ = other.tally_;
    leaks_ = other.leaks_;
    reset_ = other.reset_;
    fail_ = other.fail_;
    device_errors_ = other.device_errors_;
    new_process_ = other.new_process_;
    host_copies_ = other.host_copies_;
    calls_ = other.calls_;
    return *this;
  }
  ~FakeCudaDriver() {
    if (handle_ != nullptr) dlclose(handle_);
  }

  int misuses() const { return misuses_(); }
  FakeCudaTally tally(FakeCudaKind kind) const {
    FakeCudaTally t;
    tally_(static_cast<int>(kind), &t);
    return t;
  }
  /// Every leak: objects still live and objects that outlived a healthy context. Call it once
  /// whatever made them (backend, contexts) is gone; `report` says what and from which call.
  int Leaks(std::string* report) const { return Read(1, report); }
  /// Only objects that outlived a healthy context: leaks already made while their maker runs.
  int OutlivedContexts(std::string* report) const { return Read(0, report); }
  void Reset() const { reset_(); }
  /// See FakeCudaNewProcessFn.
  void NewProcess() const { new_process_(); }
  /// See FakeCudaFailFn (`error`: a CUresult).
  void Fail(const char* call, int after, int error) const { fail_(call, after, error); }
  /// See FakeCudaHostCopies.
  FakeCudaHostCopies host_copies() const {
    FakeCudaHostCopies copies;
    host_copies_(&copies);
    return copies;
  }
  /// Driver calls since the last reset; `by_entry` (optional) says which ("name count" lines).
  long Calls(std::string* by_entry = nullptr) const {
    char text[8192] = {};
    const long calls = calls_(text, sizeof(text));
    if (by_entry != nullptr) *by_entry = text;
    return calls;
  }
  /// See FakeCudaDeviceErrorsFn.
  int DeviceErrors(std::string* last) const {
    char text[2048] = {};
    const int errors = device_errors_(text, sizeof(text));
    if (last != nullptr) *last = text;
    return errors;
  }

 private:
  explicit FakeCudaDriver(void* handle) : handle_(handle) {}

  int Read(int count_live, std::string* report) const {
    char text[16384] = {};
    const int leaks = leaks_(count_live, text, sizeof(text));
    if (report != nullptr) *report = text;
    return leaks;
  }

  void* handle_ = nullptr;
  FakeCudaMisusesFn misuses_ = nullptr;
  FakeCudaTallyFn tally_ = nullptr;
  FakeCudaLeaksFn leaks_ = nullptr;
  FakeCudaResetFn reset_ = nullptr;
  FakeCudaFailFn fail_ = nullptr;
  FakeCudaDeviceErrorsFn device_errors_ = nullptr;
  FakeCudaNewProcessFn new_process_ = nullptr;
  FakeCudaHostCopiesFn host_copies_ = nullptr;
  FakeCudaCallsFn calls_ = nullptr;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_FAKE_CUDA_DRIVER_FAKE_CUDA_H_
