#include "server/core/region_tickets.h"

#include <utility>

#include <unistd.h>

#include "absl/strings/str_cat.h"

#include "server/common/status_macros.h"

namespace tessera {
namespace {

absl::Status UnknownTicket() {
  return absl::UnauthenticatedError(
      "the region ticket is unknown or expired (BeginRegion issues one; it is valid for 60 s)");
}

absl::Status UnknownTicketForFinish() {
  return absl::NotFoundError(
      "the region ticket is unknown, expired or already finished (BeginRegion issues one)");
}

}  // namespace

absl::StatusOr<RegionTickets::Ticket> RegionTickets::Issue(
    const std::shared_ptr<TenantRuntime>& runtime, uint64_t size) {
  if (size == 0 || size > kMaxRegionSizeBytes) {
    return absl::InvalidArgumentError(absl::StrCat("size_bytes is ", size, "; the range is 1..",
                                                   kMaxRegionSizeBytes, " (1 TiB)"));
  }
  RETURN_IF_ERROR(runtime->CheckRegionFits(size));
  ASSIGN_OR_RETURN(std::string secret, RandomToken(32));
  Ticket ticket{absl::StrCat("rt_", secret), absl::Now() + ttl_, size};
  std::vector<Expired> expired;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    expired = ExpireLocked(absl::Now());
    size_t open = 0;
    for (const auto& [hash, entry] : entries_) open += entry.tenant_id == runtime->tenant_id();
    if (open >= kMaxOpenPerTenant) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the tenant has ", open, " region tickets open, the most it may (",
                       kMaxOpenPerTenant, "); finish them or let them expire"));
    } else {
      Entry entry;
      entry.runtime = runtime;
      entry.tenant_id = runtime->tenant_id();
      entry.size = size;
      entry.expire_time = ticket.expire_time;
      entries_.emplace(HashCredential(ticket.ticket), std::move(entry));
    }
  }
  Unregister(std::move(expired));
  RETURN_IF_ERROR(status);
  return ticket;
}

absl::Status RegionTickets::Deliver(absl::string_view ticket, int fd) {
  const KeyHash hash = HashCredential(ticket);
  std::shared_ptr<TenantRuntime> runtime;
  uint64_t size = 0;
  std::vector<Expired> expired;
  absl::Status claimed;
  {
    absl::MutexLock lock(&mu_);
    expired = ExpireLocked(absl::Now());
    auto it = entries_.find(hash);
    if (it == entries_.end()) {
      claimed = UnknownTicket();
    } else if (it->second.state != Entry::State::kWaiting) {
      claimed = absl::FailedPreconditionError(
          "the region ticket was already used; BeginRegion issues a new one per descriptor");
    } else {
      runtime = it->second.runtime.lock();
      if (runtime == nullptr) {
        entries_.erase(it);
        claimed = UnknownTicket();
      } else {
        it->second.state = Entry::State::kDelivering;
        size = it->second.size;
      }
    }
  }
  Unregister(std::move(expired));
  if (!claimed.ok()) {
    if (fd >= 0) close(fd);
    return claimed;
  }
  absl::StatusOr<RegionInfo> outcome = [&]() -> absl::StatusOr<RegionInfo> {
    ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> memory, SharedMemory::Map(fd, size));
    return runtime->AddRegion(std::move(memory));
  }();
  absl::Status status = outcome.status();
  bool orphan = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(hash);
    if (it == entries_.end()) {
      orphan = outcome.ok();  // expired while it was being mapped
    } else {
      it->second.state = Entry::State::kDelivered;
      it->second.outcome = std::move(outcome);
    }
  }
  if (orphan) (void)runtime->UnregisterRegion(outcome->handle);
  return status;
}

absl::StatusOr<RegionInfo> RegionTickets::Finish(absl::string_view tenant_id,
                                                 absl::string_view ticket) {
  const KeyHash hash = HashCredential(ticket);
  std::vector<Expired> expired;
  absl::StatusOr<RegionInfo> outcome = UnknownTicketForFinish();
  {
    absl::MutexLock lock(&mu_);
    expired = ExpireLocked(absl::Now());
    auto it = entries_.find(hash);
    if (it != entries_.end() && it->second.tenant_id == tenant_id) {
      if (it->second.state != Entry::State::kDelivered) {
        outcome = absl::FailedPreconditionError(
            "no descriptor has arrived with this ticket yet: send it on the descriptor socket "
            "first (RegionTicket.socket_path), then call FinishRegion");
      } else {
        outcome = std::move(it->second.outcome);
        entries_.erase(it);
      }
    }
  }
  Unregister(std::move(expired));
  return outcome;
}

size_t RegionTickets::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

std::vector<RegionTickets::Expired> RegionTickets::ExpireLocked(absl::Time now) {
  std::vector<Expired> expired;
  for (auto it = entries_.begin(); it != entries_.end();) {
    // A ticket being delivered is kept: Deliver records its outcome (or unregisters it).
    if (it->second.expire_time > now || it->second.state == Entry::State::kDelivering) {
      ++it;
      continue;
    }
    if (it->second.state == Entry::State::kDelivered && it->second.outcome.ok()) {
      expired.push_back({it->second.runtime, it->second.outcome->handle});
    }
    it = entries_.erase(it);
  }
  return expired;
}

void RegionTickets::Unregister(std::vector<Expired> expired) {
  for (Expired& e : expired) {
    if (std::shared_ptr<TenantRuntime> runtime = e.runtime.lock()) {
      (void)runtime->UnregisterRegion(e.region);
    }
  }
}

}  // namespace tessera
