#ifndef TESSERA_SERVER_CORE_REGION_TICKETS_H_
#define TESSERA_SERVER_CORE_REGION_TICKETS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "server/core/tenant_runtime.h"
#include "server/core/token.h"

namespace tessera {

/// The one-time tickets that bind a descriptor arriving on the descriptor socket to the
/// tenant that asked for it over gRPC (docs/api.md, "Regions"):
///   1. Issue (BeginRegion, authenticated): a secret ticket for a region of `size` bytes;
///   2. Deliver (the descriptor socket): the descriptor sent with the ticket is checked,
///      mapped and added to the ticket's tenant; the outcome is kept with the ticket;
///   3. Finish (FinishRegion, authenticated as the same tenant): the outcome, once.
/// A ticket is delivered at most once and finished at most once; it expires `ttl` after it
/// was issued, and a region delivered but never finished is then unregistered.
///
/// Thread-safe. Tickets are kept by their hash, so lookups compare no secrets.
class RegionTickets {
 public:
  static constexpr absl::Duration kDefaultTtl = absl::Seconds(60);
  /// Tickets one tenant may hold open (issued, not yet finished nor expired).
  static constexpr size_t kMaxOpenPerTenant = 16;

  explicit RegionTickets(absl::Duration ttl = kDefaultTtl) : ttl_(ttl) {}

  struct Ticket {
    std::string ticket;
    absl::Time expire_time;
    uint64_t size_bytes = 0;
  };
  /// RESOURCE_EXHAUSTED when the tenant holds kMaxOpenPerTenant tickets or the region would
  /// not fit its quota; INVALID_ARGUMENT for a size of 0 or above kMaxRegionSizeBytes.
  absl::StatusOr<Ticket> Issue(const std::shared_ptr<TenantRuntime>& runtime, uint64_t size)
      ABSL_LOCKS_EXCLUDED(mu_);

  /// Step 2: takes ownership of `fd` (closed on every path). Returns the outcome, which is
  /// also kept for Finish: UNAUTHENTICATED for an unknown or expired ticket (nothing is
  /// kept), FAILED_PRECONDITION for a ticket already used, else SharedMemory::Map's and
  /// TenantRuntime::AddRegion's errors. May block on the device.
  absl::Status Deliver(absl::string_view ticket, int fd) ABSL_LOCKS_EXCLUDED(mu_);

  /// Step 3, for `tenant_id` only (another tenant's ticket is NOT_FOUND, as an unknown one).
  /// FAILED_PRECONDITION while no descriptor has arrived.
  absl::StatusOr<RegionInfo> Finish(absl::string_view tenant_id, absl::string_view ticket)
      ABSL_LOCKS_EXCLUDED(mu_);

  /// Open tickets (for tests and metrics).
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::weak_ptr<TenantRuntime> runtime;
    std::string tenant_id;
    uint64_t size = 0;
    absl::Time expire_time;
    enum class State { kWaiting, kDelivering, kDelivered } state = State::kWaiting;
    absl::StatusOr<RegionInfo> outcome = absl::UnknownError("not delivered");
  };
  struct Expired {
    std::weak_ptr<TenantRuntime> runtime;
    std::string region;  // a delivered region nobody finished: unregistered
  };
  /// Forgets expired tickets; returns the regions to unregister (after the lock).
  std::vector<Expired> ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Unregister(std::vector<Expired> expired);

  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  std::map<KeyHash, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_REGION_TICKETS_H_
