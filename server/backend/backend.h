#ifndef TESSERA_SERVER_BACKEND_BACKEND_H_
#define TESSERA_SERVER_BACKEND_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "kernels/registry.h"
#include "server/common/tenant.h"

namespace tessera {

/// How a tenant's work is isolated; mirrors tessera.v1.ContextKind.
enum class ContextKind { kCpu, kMps, kFallback, kGreen };

absl::string_view ContextKindName(ContextKind kind);

struct ContextInfo {
  ContextKind kind = ContextKind::kCpu;
  /// Why this kind was obtained, for people (API and logs).
  std::string reason;
  /// False when the compute share is advisory only.
  bool compute_share_enforced = false;
};

/// Whether tenant contexts use MPS; mirrors tessera.v1.MpsDecision.
enum class MpsDecision { kMps, kFallback, kNotApplicable };

struct MpsState {
  MpsDecision decision = MpsDecision::kNotApplicable;
  std::string reason;
};

/// A device tenants can be placed on.
struct DeviceInfo {
  int index = 0;
  std::string name;
  uint64_t memory_bytes = 0;
  /// Most contexts the device admits (48 MPS clients on Volta and later); 0: no limit.
  uint32_t context_limit = 0;
  /// SMs (GPU) or worker threads (CPU).
  uint32_t compute_units = 0;
  /// Most jobs the core releases to the device at once, all tenants together (0: no bound
  /// beyond Backend::stream_in_flight() per stream). Above it jobs wait in the core's queues,
  /// where they can still be cancelled and are released in weighted fair order.
  uint32_t max_in_flight = 0;
};

struct ContextRequest {
  std::string tenant_id;
  Quota quota;
  int device_index = 0;
};

/// Memory in a tenant's context, freed when the last reference is dropped (jobs hold
/// references to the buffers they use, so a buffer outlives its tensor while in use).
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual uint64_t size() const = 0;
  /// True once a fault destroyed the memory (the GPU context it lived in faulted): reads,
  /// writes and launches using it are DATA_LOSS; deleting it is fine.
  virtual bool lost() const { return false; }
  /// The bytes where this process can read them in place (the CPU backend's host memory), or
  /// nullptr where only TenantContext::CopyOut reaches them (a GPU's memory). What the pointer
  /// shows changes only as CopyIn and jobs write the buffer; it stays valid while the buffer
  /// lives.
  virtual const void* host_data() const { return nullptr; }
};

/// One validated launch with its buffers (inputs in the plan's order, then outputs).
struct Step {
  kernels::Plan plan;
  std::vector<std::shared_ptr<DeviceBuffer>> inputs;
  std::vector<std::shared_ptr<DeviceBuffer>> outputs;
};

/// How a released job ended.
struct ExecResult {
  /// OK; CANCELLED (the context closed before it started); or the failure of step
  /// `failed_step` (steps before it completed, later ones did not run).
  absl::Status status;
  int failed_step = -1;
  /// Time the job spent executing (charged to the tenant's fair share); zero if unknown.
  absl::Duration run_time;
};

/// A tenant's execution context. Owned by the tenant's runtime (server/core); destroying it
/// waits for the jobs released to it, calls their `done`, and releases every resource the
/// tenant holds on the device.
///
/// Threading contract (see docs/architecture.md, "Threads and locks"):
/// - Every method may be called from any thread, concurrently. The core never holds one of its
///   own locks (TenantRuntime, JobScheduler, TenantTable) while calling a method here, and a
///   backend never holds one of its locks while calling back into the core (`done`).
/// - Methods may block on the device (allocation, copies, synchronization) but never on the
///   core; they never call `done` of a job other than the one being enqueued.
/// - Jobs: the core queues jobs, applies queue bounds, fair order, deadlines and cancellation,
///   and calls Enqueue only for a job that is to run now, at most Backend::stream_in_flight()
///   per stream at a time. The backend runs a stream's jobs in Enqueue order.
class TenantContext {
 public:
  virtual ~TenantContext() = default;
  /// Fixed for the context's lifetime.
  virtual const ContextInfo& info() const = 0;

  /// `bytes` of zero-filled memory. RESOURCE_EXHAUSTED when the device has no room.
  virtual absl::StatusOr<std::shared_ptr<DeviceBuffer>> Allocate(uint64_t bytes) = 0;
  /// `bytes` whose contents are unspecified (possibly another tenant's freed bytes): for a
  /// caller that writes every byte before anything reads the buffer or it leaves the core (an
  /// upload's new tensor or staging copy). Saves the zero-fill. The default zero-fills.
  virtual absl::StatusOr<std::shared_ptr<DeviceBuffer>> AllocateForOverwrite(uint64_t bytes) {
    return Allocate(bytes);
  }
  /// Synchronous copies between host memory and a buffer (ranges checked by the caller). They
  /// may run concurrently with jobs and with each other; the caller keeps a buffer being
  /// copied away from jobs that write it. Never called on a gRPC callback thread.
  virtual absl::Status CopyIn(DeviceBuffer& dst, uint64_t offset, const void* src,
                              uint64_t bytes) = 0;
  virtual absl::Status CopyOut(const DeviceBuffer& src, uint64_t offset, void* dst,
                               uint64_t bytes) = 0;
  /// CopyIn of `pieces` laid end to end from `offset`: a message's bytes where the transport
  /// received them, in several buffers. The default copies piece by piece; a backend whose
  /// copies cost a synchronization each (a GPU) gathers them into one.
  virtual absl::Status CopyInPieces(DeviceBuffer& dst, uint64_t offset,
                                    absl::Span<const absl::string_view> pieces) {
    for (absl::string_view piece : pieces) {
      absl::Status status = CopyIn(dst, offset, piece.data(), piece.size());
      if (!status.ok()) return status;
      offset += piece.size();
    }
    return absl::OkStatus();
  }

  /// Host memory registered with the device (a tenant's shared-memory region): while it
  /// lives, CopyIn/CopyOut whose host range lies inside the registered range copy directly
  /// (one DMA on a GPU, no staging copy). Destroying it unregisters the range; the caller
  /// destroys it before the context, and never while a copy uses the range.
  class HostRegistration {
   public:
    virtual ~HostRegistration() = default;
  };
  /// Registers [base, base + bytes) for direct copies. nullptr where the backend copies
  /// host memory directly anyway (the CPU backend). RESOURCE_EXHAUSTED / UNAVAILABLE when the
  /// driver refuses (the message names it). May block on the device.
  virtual absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHost(void* base,
                                                                         uint64_t bytes) {
    (void)base;
    (void)bytes;
    return nullptr;
  }

  /// Bytes a job of `steps` allocates while it runs besides its outputs (in-place temporaries,
  /// widening buffers, library workspaces). The core reserves them from the tenant's memory
  /// quota before releasing the job. Pure: takes no lock.
  virtual uint64_t ScratchBytes(const std::vector<Step>& steps) const = 0;

  /// Runs `steps` in order on `stream`, after the jobs enqueued on it before. `done` is called
  /// exactly once, on any thread (inside Enqueue when the job fails at once), with no backend
  /// lock held; it may call back into the core, which may call Enqueue again.
  virtual void Enqueue(int stream, std::vector<Step> steps,
                       absl::AnyInvocable<void(ExecResult) &&> done) = 0;

  /// Time this tenant's work has spent executing.
  virtual absl::Duration busy_time() const = 0;
};

/// The execution backend: the CPU backend here, the CUDA module where a driver exists.
/// Owned by the Server; every other component holds a non-owning pointer that must not
/// outlive it. All methods are thread-safe.
class Backend {
 public:
  virtual ~Backend() = default;

  /// "cpu" or "cuda".
  virtual absl::string_view name() const = 0;
  /// Devices, indexed 0..n-1. Fixed for the backend's lifetime.
  virtual const std::vector<DeviceInfo>& devices() const = 0;
  virtual MpsState mps() const = 0;

  /// Creates a context for a tenant already admitted to `request.device_index`.
  /// UNAVAILABLE when the device cannot create one now. May block on the device; called
  /// with no core lock held.
  virtual absl::StatusOr<std::unique_ptr<TenantContext>> CreateContext(
      const ContextRequest& request) = 0;

  /// Jobs the core releases per stream before the first of them completes (>= 1): one keeps
  /// a CPU worker's stream busy, two let a GPU start the next job without a host round trip.
  virtual int stream_in_flight() const { return 1; }

  /// Called at most once, from a backend thread with no backend lock held, when the backend
  /// can run nothing more in this process (a CUDA error the driver makes fatal to the
  /// process: every tenant's work has failed and their tensors are lost); `why` says what
  /// happened. The server then stops and exits non-zero so that its supervisor restarts it.
  /// Set before the first context is created. The CPU backend never calls it.
  virtual void SetFatalHandler(absl::AnyInvocable<void(const absl::Status& why)> handler) {
    (void)handler;
  }
};

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_BACKEND_H_
