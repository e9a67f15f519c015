#include "server/core/memory_ledger.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

#include "server/common/telemetry.h"

namespace tessera {

MemoryCharge& MemoryCharge::operator=(MemoryCharge&& other) noexcept {
  if (this != &other) {
    Release();
    ledger_ = std::move(other.ledger_);
    use_ = other.use_;
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

MemoryCharge MemoryCharge::Split(uint64_t bytes) {
  bytes = std::min(bytes, bytes_);
  bytes_ -= bytes;
  return MemoryCharge(ledger_, use_, bytes);
}

void MemoryCharge::Release() {
  if (ledger_ != nullptr) ledger_->Return(use_, bytes_);
  ledger_.reset();
  bytes_ = 0;
}

std::shared_ptr<MemoryLedger> MemoryLedger::Create(std::string tenant_id, uint64_t quota_bytes) {
  return std::shared_ptr<MemoryLedger>(new MemoryLedger(std::move(tenant_id), quota_bytes));
}

absl::Status MemoryLedger::ExhaustedLocked(uint64_t bytes, absl::string_view what) const {
  return telemetry::WithRefusalReason(
      absl::ResourceExhaustedError(absl::StrCat(
          "tenant \"", tenant_id_, "\" memory quota: ", used_, " bytes used + ", bytes, " ", what,
          " > quota.device_memory_bytes ", quota_, " (used: tensors ", by_use_[0], ", job scratch ",
          by_use_[1], ", transfer staging ", by_use_[2], "); delete tensors to free memory")),
      "tenant_memory");
}

absl::StatusOr<MemoryCharge> MemoryLedger::Reserve(MemoryUse use, uint64_t bytes,
                                                   absl::string_view what) {
  {
    absl::MutexLock lock(&mu_);
    if (bytes > quota_ - std::min(used_, quota_)) return ExhaustedLocked(bytes, what);
    used_ += bytes;
    by_use_[static_cast<int>(use)] += bytes;
    peak_ = std::max(peak_, used_);
  }
  return MemoryCharge(shared_from_this(), use, bytes);
}

absl::Status MemoryLedger::CheckFitsBesideTensors(uint64_t bytes, absl::string_view what) const {
  absl::MutexLock lock(&mu_);
  const uint64_t tensors = by_use_[static_cast<int>(MemoryUse::kTensors)];
  if (bytes <= quota_ - std::min(tensors, quota_)) return absl::OkStatus();
  return ExhaustedLocked(bytes, what);
}

void MemoryLedger::Return(MemoryUse use, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
  by_use_[static_cast<int>(use)] -= bytes;
}

MemoryLedger::Snapshot MemoryLedger::snapshot() const {
  absl::MutexLock lock(&mu_);
  return Snapshot{.tensors = by_use_[0],
                  .scratch = by_use_[1],
                  .staging = by_use_[2],
                  .used = used_,
                  .peak = peak_,
                  .quota = quota_};
}

uint64_t MemoryLedger::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

std::shared_ptr<DeviceBuffer> ChargedBuffer(std::shared_ptr<DeviceBuffer> buffer,
                                            MemoryCharge charge) {
  // Members are destroyed in reverse order: the buffer is freed before the charge returns.
  struct Held {
    MemoryCharge charge;
    std::shared_ptr<DeviceBuffer> buffer;
  };
  auto held = std::make_shared<Held>(Held{std::move(charge), std::move(buffer)});
  DeviceBuffer* raw = held->buffer.get();
  return std::shared_ptr<DeviceBuffer>(std::move(held), raw);
}

}  // namespace tessera
