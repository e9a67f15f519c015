#ifndef TESSERA_SERVER_BACKEND_CUDA_RESOURCES_H_
#define TESSERA_SERVER_BACKEND_CUDA_RESOURCES_H_

// RAII owners of the driver objects a tenant's context holds: streams, events, device and
// pinned memory, the cuBLAS handle, and the context itself (Incarnation). Each is destroyed
// exactly once, by its owner, in its own context: nothing is left for cuCtxDestroy to sweep
// (a green context's streams and events would outlive it) and nothing is destroyed twice.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "server/backend/backend.h"
#include "server/backend/cuda/driver.h"

namespace tessera::cuda {

class CudaBackend;

/// One driver object, destroyed with `Destroy` (a Driver entry point) when the owner goes or
/// is reset. The caller makes the object's context current where the driver requires it.
/// Move-only; not thread-safe.
template <typename Handle, auto Destroy>
class Owned {
 public:
  Owned() = default;
  Owned(const Driver& driver, Handle handle) : driver_(&driver), handle_(handle) {}
  Owned(Owned&& other) noexcept
      : driver_(other.driver_), handle_(std::exchange(other.handle_, Handle{})) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      Reset();
      driver_ = other.driver_;
      handle_ = std::exchange(other.handle_, Handle{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { Reset(); }

  Handle get() const { return handle_; }
  explicit operator bool() const { return handle_ != Handle{}; }
  void Reset() {
    if (handle_ != Handle{}) (driver_->*Destroy)(handle_);
    handle_ = Handle{};
  }
  /// Forgets the object: it was destroyed with its context (after a fault).
  void Abandon() { handle_ = Handle{}; }

 private:
  const Driver* driver_ = nullptr;
  Handle handle_{};
};

using Stream = Owned<CUstream, &Driver::cuStreamDestroy>;
using Event = Owned<CUevent, &Driver::cuEventDestroy>;
using DeviceMemory = Owned<CUdeviceptr, &Driver::cuMemFree>;
using PinnedMemory = Owned<void*, &Driver::cuMemFreeHost>;
using Module = Owned<CUmodule, &Driver::cuModuleUnload>;
using Graph = Owned<CUgraph, &Driver::cuGraphDestroy>;
using GraphExec = Owned<CUgraphExec, &Driver::cuGraphExecDestroy>;

/// A program captured as a CUDA graph and instantiated (CudaContext::LaunchProgramLocked).
struct CapturedProgram {
  GraphExec exec;
  /// The device addresses its nodes use now (every step's inputs, then outputs): a job with
  /// the same ones replays it as it is.
  std::vector<CUdeviceptr> addresses;
  /// When it was last launched (Incarnation::program_clock), for evicting the least recent.
  uint64_t last_use = 0;
};

/// A tenant-defined kernel's compiled image loaded into one context.
struct UserModule {
  Module module;
  CUfunction function = nullptr;
  /// When it was last launched (Incarnation::user_clock), for unloading the least recent.
  uint64_t last_use = 0;
};

/// A cuBLAS handle bound to the context current when it was created, with a workspace of
/// ours per stream it runs on (so its size is known and charged to the tenant, and two
/// streams' GEMMs never share scratch memory on the device at once).
class BlasHandle {
 public:
  BlasHandle() = default;
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  ~BlasHandle() { Reset(); }

  /// Creates the handle in the current context; each stream's workspace, of
  /// `workspace_bytes`, is allocated at its first Bind.
  cublasStatus_t Create(const Driver& driver, uint64_t workspace_bytes);
  cublasHandle_t get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }
  /// Binds the handle to `stream` and to that stream's workspace (allocated now the first
  /// time, in the current context; a failure is `driver_error`). Again before every call:
  /// cublasSetStream resets the workspace to cuBLAS's own pool (its documentation), memory
  /// nobody is charged for.
  cublasStatus_t Bind(CUstream stream, CUresult& driver_error);
  /// Whether `stream` has its workspace already (Bind then allocates nothing).
  bool HasWorkspace(CUstream stream) const;
  void Reset();

 private:
  const Driver* driver_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  uint64_t workspace_bytes_ = 0;
  std::vector<std::pair<CUstream, DeviceMemory>> workspaces_;
};

/// One creation of a tenant's CUDA context. A sticky fault retires it (`lost`) and the tenant
/// gets a new one; buffers keep the incarnation they were allocated in, so a lost buffer is
/// recognizable and never freed into the wrong context. Destroy() (or the destructor)
/// releases everything it owns, then the context.
struct Incarnation {
  explicit Incarnation(const Driver& d) : driver(&d) {}
  ~Incarnation() { Destroy(); }
  Incarnation(const Incarnation&) = delete;
  Incarnation& operator=(const Incarnation&) = delete;

  /// Releases every owned object (with the context current), then the context and a green
  /// context's SM groups. Idempotent; after a fault the objects go with the context.
  void Destroy() ABSL_LOCKS_EXCLUDED(use_mu);

  const Driver* const driver;
  CUcontext context = nullptr;
  CUgreenCtx green = nullptr;
  std::vector<Stream> streams;  // the tenant's streams, by index
  Stream copy;                  // transfers and zero-fills
  BlasHandle blas;              // created by the first matmul
  PinnedMemory staging[2];      // transfer staging, allocated by the first copy
  Event staging_done[2];
  // Finished jobs' timing events, for the next jobs (two cuEventCreate and two
  // cuEventDestroy fewer per job); guarded by the owning CudaContext's mu_.
  std::vector<Event> spare_events;
  // Tenant-defined kernels loaded here, by program hash (loaded on first use, unloaded when
  // too many or with the context); guarded by the owning CudaContext's mu_.
  std::map<std::string, UserModule> user_modules;
  uint64_t user_clock = 0;
  // Programs run as CUDA graphs, by ProgramKey, and how often each program not captured yet
  // has been seen; guarded by the owning CudaContext's mu_. Emptied when a tenant-defined
  // kernel's module is unloaded (a graph may launch its function).
  std::map<std::string, CapturedProgram> programs;
  std::map<std::string, int> program_sightings;
  uint64_t program_clock = 0;
  int sms = 0;
  // A green context's SM groups, returned to `owner` when it goes.
  CudaBackend* owner = nullptr;
  int device = 0;
  std::vector<int> sm_groups;
  std::atomic<bool> lost{false};
  // Held shared by whoever uses the context outside its CudaContext's mu_ (allocations,
  // copies, frees) and exclusively by Destroy, so a fault never frees what a copy is using.
  absl::Mutex use_mu;
};

/// Device memory of one incarnation; freed in it unless the incarnation was lost.
class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(std::shared_ptr<Incarnation> inc, CUdeviceptr ptr, uint64_t size)
      : inc_(std::move(inc)), ptr_(ptr), size_(size) {}
  ~CudaBuffer() override;
  uint64_t size() const override { return size_; }
  bool lost() const override { return inc_->lost.load(); }
  CUdeviceptr ptr() const { return ptr_; }
  const Incarnation* incarnation() const { return inc_.get(); }

 private:
  std::shared_ptr<Incarnation> inc_;
  CUdeviceptr ptr_;
  uint64_t size_;
};

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_RESOURCES_H_
