#ifndef TESSERA_SERVER_BACKEND_CUDA_DRIVER_H_
#define TESSERA_SERVER_BACKEND_CUDA_DRIVER_H_

// The CUDA driver API reached at run time: libcuda.so.1 is dlopen'ed and every entry point
// is fetched with cuGetProcAddress for the CUDA 13 ABI (so cuCtxCreate is the variant that
// takes CUctxCreateParams). Nothing links against libcuda. Entry points are asked for by
// their base name ("cuMemHostRegister"): cuGetProcAddress returns the variant of that ABI
// (cuMemHostRegister_v2), which is the type cuda.h's macros give the members.
#include <functional>
#include <memory>
#include <string>

#include <cuda.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::cuda {

// clang-format off
// Entry points the backend cannot work without.
#define TESSERA_CUDA_REQUIRED(X) \
  X(cuInit)                      \
  X(cuDriverGetVersion)          \
  X(cuDeviceGetCount)            \
  X(cuDeviceGet)                 \
  X(cuDeviceGetName)             \
  X(cuDeviceTotalMem)            \
  X(cuDeviceGetAttribute)        \
  X(cuCtxCreate)                 \
  X(cuCtxDestroy)                \
  X(cuCtxPushCurrent)            \
  X(cuCtxPopCurrent)             \
  X(cuCtxGetExecAffinity)        \
  X(cuCtxGetStreamPriorityRange) \
  X(cuMemAlloc)                  \
  X(cuMemFree)                   \
  X(cuMemsetD8Async)             \
  X(cuMemcpyHtoDAsync)           \
  X(cuMemcpyDtoHAsync)           \
  X(cuMemcpyDtoDAsync)           \
  X(cuMemHostAlloc)              \
  X(cuMemFreeHost)               \
  X(cuMemHostRegister)           \
  X(cuMemHostUnregister)         \
  X(cuMemGetInfo)                \
  X(cuStreamCreateWithPriority)  \
  X(cuStreamDestroy)             \
  X(cuStreamSynchronize)         \
  X(cuStreamQuery)               \
  X(cuLaunchHostFunc)            \
  X(cuLaunchKernel)              \
  X(cuEventCreate)               \
  X(cuEventDestroy)              \
  X(cuEventRecord)               \
  X(cuEventQuery)                \
  X(cuEventSynchronize)          \
  X(cuEventElapsedTime)          \
  X(cuLibraryLoadData)           \
  X(cuLibraryUnload)             \
  X(cuLibraryGetKernel)          \
  X(cuKernelGetFunction)         \
  X(cuModuleLoadData)            \
  X(cuModuleUnload)              \
  X(cuModuleGetFunction)         \
  X(cuGetErrorName)              \
  X(cuGetErrorString)            \
  X(cuStreamBeginCapture)        \
  X(cuStreamEndCapture)          \
  X(cuGraphDestroy)              \
  X(cuGraphInstantiateWithFlags) \
  X(cuGraphExecDestroy)          \
  X(cuGraphLaunch)               \
  X(cuGraphExecUpdate)

// Green contexts (CUDA 12.4 and later); absent entry points leave them unavailable.
#define TESSERA_CUDA_OPTIONAL(X) \
  X(cuDeviceGetDevResource)      \
  X(cuDevSmResourceSplitByCount) \
  X(cuDevResourceGenerateDesc)   \
  X(cuGreenCtxCreate)            \
  X(cuGreenCtxDestroy)           \
  X(cuCtxFromGreenCtx)           \
  X(cuGreenCtxStreamCreate)
// clang-format on

/// The loaded driver. Immutable after Load; thread-safe.
struct Driver {
#define TESSERA_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
  TESSERA_CUDA_REQUIRED(TESSERA_CUDA_MEMBER)
  TESSERA_CUDA_OPTIONAL(TESSERA_CUDA_MEMBER)
#undef TESSERA_CUDA_MEMBER

  /// cuDriverGetVersion, e.g. 13000.
  int version = 0;
  /// Whether every green-context entry point was found.
  bool green_entry_points = false;
  /// Told of every process-fatal error Check sees (ClassifyCudaError), wherever it surfaces:
  /// also one seen by a context that is then destroyed, or while creating one. Set once,
  /// before the driver is shared; must not block (it is called under callers' locks).
  std::function<void(CUresult)> on_process_fatal;

  /// dlopens libcuda.so.1, resolves the entry points and calls cuInit(0). FAILED_PRECONDITION
  /// saying what is missing (no driver, a driver older than CUDA 13, cuInit failing).
  static absl::StatusOr<std::unique_ptr<Driver>> Load();

  /// OK, or the status for `result` (gpu_policy's classes) naming `what`.
  absl::Status Check(CUresult result, absl::string_view what) const;
  /// "CUDA_ERROR_ILLEGAL_ADDRESS".
  std::string ErrorName(CUresult result) const;

  Driver() = default;
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  ~Driver();

 private:
  void* handle_ = nullptr;
};

/// Makes `context` current on this thread for the scope (push/pop).
class ScopedContext {
 public:
  ScopedContext(const Driver& driver, CUcontext context) : driver_(driver) {
    driver_.cuCtxPushCurrent(context);
  }
  ~ScopedContext() {
    CUcontext popped = nullptr;
    driver_.cuCtxPopCurrent(&popped);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver& driver_;
};

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_DRIVER_H_
