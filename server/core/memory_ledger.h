#ifndef TESSERA_SERVER_CORE_MEMORY_LEDGER_H_
#define TESSERA_SERVER_CORE_MEMORY_LEDGER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

#include "server/backend/backend.h"

namespace tessera {

class MemoryLedger;

/// What a tenant's memory is used for (GetUsage shows the breakdown).
enum class MemoryUse {
  kTensors,  // tensor buffers, including a WriteTensor's staging copy until it commits
  kScratch,  // what a running job allocates besides its outputs (temporaries, workspaces)
  kStaging,  // transfer chunks held in host memory (ReadTensor)
};

/// Bytes reserved from a ledger, returned when the charge is destroyed. Move-only.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  MemoryCharge(MemoryCharge&& other) noexcept { *this = std::move(other); }
  MemoryCharge& operator=(MemoryCharge&& other) noexcept;
  MemoryCharge(const MemoryCharge&) = delete;
  MemoryCharge& operator=(const MemoryCharge&) = delete;
  ~MemoryCharge() { Release(); }

  uint64_t bytes() const { return bytes_; }
  /// Moves `bytes` (at most all) of this charge into a charge of their own.
  MemoryCharge Split(uint64_t bytes);
  /// Returns the bytes now (idempotent).
  void Release();

 private:
  friend class MemoryLedger;
  MemoryCharge(std::shared_ptr<MemoryLedger> ledger, MemoryUse use, uint64_t bytes)
      : ledger_(std::move(ledger)), use_(use), bytes_(bytes) {}
  std::shared_ptr<MemoryLedger> ledger_;
  MemoryUse use_ = MemoryUse::kTensors;
  uint64_t bytes_ = 0;
};

/// Every byte a tenant's work holds, against its memory quota: tensors, job scratch and
/// transfer staging. A charge is taken before the memory is allocated and returned when the
/// memory is actually freed (a buffer still referenced by a stalled transfer stays charged),
/// so `used()` reaching zero after the tenant closed means its memory is really gone.
///
/// Thread-safe. Its mutex is a leaf: nothing is called while it is held, so any lock may be
/// held when calling in.
class MemoryLedger : public std::enable_shared_from_this<MemoryLedger> {
 public:
  struct Snapshot {
    uint64_t tensors = 0, scratch = 0, staging = 0;
    uint64_t used = 0, peak = 0, quota = 0;
  };

  static std::shared_ptr<MemoryLedger> Create(std::string tenant_id, uint64_t quota_bytes);

  /// Reserves `bytes` for `use`. RESOURCE_EXHAUSTED naming the quota, what is used and
  /// `what` (e.g. "for new outputs") unless they fit.
  absl::StatusOr<MemoryCharge> Reserve(MemoryUse use, uint64_t bytes, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_);
  /// OK when `bytes` more could ever fit beside the tenant's tensors (scratch and staging
  /// come and go); RESOURCE_EXHAUSTED otherwise.
  absl::Status CheckFitsBesideTensors(uint64_t bytes, absl::string_view what) const
      ABSL_LOCKS_EXCLUDED(mu_);

  Snapshot snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t quota() const { return quota_; }

 private:
  friend class MemoryCharge;
  MemoryLedger(std::string tenant_id, uint64_t quota_bytes)
      : tenant_id_(std::move(tenant_id)), quota_(quota_bytes) {}
  void Return(MemoryUse use, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ExhaustedLocked(uint64_t bytes, absl::string_view what) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string tenant_id_;
  const uint64_t quota_;
  mutable absl::Mutex mu_;
  uint64_t by_use_[3] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

/// `buffer` carrying `charge`: the charge is returned right after the buffer is freed,
/// whoever drops the last reference.
std::shared_ptr<DeviceBuffer> ChargedBuffer(std::shared_ptr<DeviceBuffer> buffer,
                                            MemoryCharge charge);

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_MEMORY_LEDGER_H_
