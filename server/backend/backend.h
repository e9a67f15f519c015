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

#include "kernels/registry.h"
#include "server/core/tenant.h"

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
};

/// One validated launch with its buffers (inputs in the plan's order, then outputs).
struct Step {
  kernels::Plan plan;
  std::vector<std::shared_ptr<DeviceBuffer>> inputs;
  std::vector<std::shared_ptr<DeviceBuffer>> outputs;
};

/// How an enqueued program ended.
struct ExecResult {
  /// OK; CANCELLED (cancelled before it started, or the context closed); or the failure of
  /// step `failed_step` (steps before it completed, later ones did not run).
  absl::Status status;
  int failed_step = -1;
};

/// A tenant's execution context. Owned by the tenant's runtime; destroying it cancels what
/// is queued, waits for what runs, and releases every resource the tenant holds on the
/// device. All methods are thread-safe.
class TenantContext {
 public:
  virtual ~TenantContext() = default;
  /// Fixed for the context's lifetime.
  virtual const ContextInfo& info() const = 0;

  /// `bytes` of zero-filled memory. RESOURCE_EXHAUSTED when the device has no room.
  virtual absl::StatusOr<std::shared_ptr<DeviceBuffer>> Allocate(uint64_t bytes) = 0;
  /// Synchronous copies between host memory and a buffer (ranges checked by the caller).
  virtual absl::Status CopyIn(DeviceBuffer& dst, uint64_t offset, const void* src,
                              uint64_t bytes) = 0;
  virtual absl::Status CopyOut(const DeviceBuffer& src, uint64_t offset, void* dst,
                               uint64_t bytes) = 0;

  /// Runs `steps` in order after everything enqueued earlier on `stream`. Just before they
  /// start, `start()` is called; returning false skips them (the job was cancelled). `done`
  /// is called exactly once, on any thread, and must not block.
  virtual void Enqueue(int stream, std::vector<Step> steps, absl::AnyInvocable<bool()> start,
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
  /// UNAVAILABLE when the device cannot create one now.
  virtual absl::StatusOr<std::unique_ptr<TenantContext>> CreateContext(
      const ContextRequest& request) = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_BACKEND_H_
