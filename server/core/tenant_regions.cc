// TenantRuntime's shared-memory regions: a client's memfd mapped in the server (and registered
// with the device), and transfers between a region and a tensor with one copy each way.
#include <utility>

#include "absl/strings/str_cat.h"

#include "server/common/status_macros.h"
#include "server/core/tenant_runtime.h"
#include "server/core/token.h"
#include "server/core/validation.h"

namespace tessera {
namespace {

absl::Status RegionNotFound(absl::string_view handle) {
  // The same for an unknown handle and another tenant's: no existence oracle.
  return absl::NotFoundError(absl::StrCat("region \"", handle.substr(0, 64), "\" not found"));
}

uint64_t RegionQuota(const Quota& quota) {
  return quota.max_region_bytes != 0 ? quota.max_region_bytes : quota.device_memory_bytes;
}

// [offset, offset + length) inside `size` bytes, without overflow.
bool InRange(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace

// A transfer's use of a region: while it lives the region cannot be unregistered, and the
// mapping stays even if the tenant closes (the region is then freed when this ends).
class TenantRuntime::RegionPin {
 public:
  RegionPin(TenantRuntime* runtime, std::shared_ptr<Region> region)
      : runtime_(runtime), region_(std::move(region)) {}
  ~RegionPin() {
    absl::MutexLock lock(&runtime_->mu_);
    region_->info.transfers--;
  }
  RegionPin(const RegionPin&) = delete;
  RegionPin& operator=(const RegionPin&) = delete;
  char* data() const { return region_->memory->data(); }
  uint64_t size() const { return region_->memory->size(); }

 private:
  TenantRuntime* const runtime_;
  std::shared_ptr<Region> region_;
};

absl::Status TenantRuntime::CheckRegionFits(uint64_t size) const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  return RegionFitsLocked(size);
}

absl::Status TenantRuntime::RegionFitsLocked(uint64_t size) const {
  const uint64_t quota = RegionQuota(quota_);
  if (regions_.size() >= kMaxRegionsPerTenant) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the tenant has ", regions_.size(), " regions, the most it may hold (",
                     kMaxRegionsPerTenant, "); unregister one first"));
  }
  if (size > quota || region_bytes_ > quota - size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a region of ", size, " bytes does not fit quota.max_region_bytes (", quota,
                     " bytes, ", region_bytes_, " in use by ", regions_.size(), " regions)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionInfo> TenantRuntime::AddRegion(std::unique_ptr<SharedMemory> memory) {
  auto region = std::make_shared<Region>();
  region->info.size_bytes = memory->size();
  region->info.create_time = absl::Now();
  ASSIGN_OR_RETURN(std::string random, RandomToken(16));
  region->info.handle = absl::StrCat("rg_", random);
  RETURN_IF_ERROR(CheckRegionFits(memory->size()));
  region->context = ContextOrNull();
  if (region->context == nullptr) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckOpen());
    return absl::FailedPreconditionError("the tenant is closed");
  }
  // Registration may block on the device: no lock held.
  ASSIGN_OR_RETURN(region->registration,
                   region->context->RegisterHost(memory->data(), memory->size()));
  region->memory = std::move(memory);
  // Checked again: another region may have been added while this one was registered.
  std::shared_ptr<Region> refused;  // freed after the lock, if it does not fit after all
  absl::MutexLock lock(&mu_);
  absl::Status fits = CheckOpen();
  if (fits.ok()) fits = RegionFitsLocked(region->info.size_bytes);
  if (!fits.ok()) {
    refused = std::move(region);
    return fits;
  }
  region_bytes_ += region->info.size_bytes;
  regions_.emplace(region->info.handle, region);
  return region->info;
}

absl::StatusOr<uint64_t> TenantRuntime::UnregisterRegion(absl::string_view handle) {
  std::shared_ptr<Region> removed;  // unmapped after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) return RegionNotFound(handle);
  if (it->second->info.transfers > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("region \"", handle, "\" is in use by ", it->second->info.transfers,
                     " transfer(s); unregister it when they have finished"));
  }
  removed = std::move(it->second);
  regions_.erase(it);
  region_bytes_ -= removed->info.size_bytes;
  return removed->info.size_bytes;
}

std::vector<RegionInfo> TenantRuntime::ListRegions() const {
  std::vector<RegionInfo> out;
  absl::MutexLock lock(&mu_);
  out.reserve(regions_.size());
  for (const auto& [handle, region] : regions_) out.push_back(region->info);
  return out;
}

absl::StatusOr<TensorInfo> TenantRuntime::WriteFromRegion(
    const std::string& handle, const std::optional<kernels::TensorMeta>& create,
    absl::string_view region, uint64_t offset, uint64_t length) {
  ASSIGN_OR_RETURN(std::unique_ptr<RegionPin> pin, PinRegion(region));
  ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer, BeginWrite(handle, create));
  const uint64_t size = writer->info().size_bytes;
  if (length != 0 && length != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("length is ", length, "; ", kernels::MetaString(writer->info().meta),
                     " needs exactly ", size, " bytes (or 0 for that)"));
  }
  if (!InRange(offset, size, pin->size())) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " + ", size,
                                                   " bytes is outside region \"", region, "\" (",
                                                   pin->size(), " bytes)"));
  }
  if (size > 0) {
    RETURN_IF_ERROR(writer->Write(0, absl::string_view(pin->data() + offset, size)));
  }
  return writer->Finish();
}

absl::StatusOr<TenantRuntime::RegionRead> TenantRuntime::ReadIntoRegion(absl::string_view handle,
                                                                        uint64_t offset,
                                                                        uint64_t length,
                                                                        absl::string_view region,
                                                                        uint64_t region_offset) {
  ASSIGN_OR_RETURN(std::unique_ptr<RegionPin> pin, PinRegion(region));
  ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, BeginRead(handle));
  const uint64_t size = reader->info().size_bytes;
  if (!InRange(offset, length, size)) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " + length ", length,
                                                   " is outside the tensor's ", size, " bytes"));
  }
  const uint64_t bytes = length == 0 ? size - offset : length;
  if (!InRange(region_offset, bytes, pin->size())) {
    return absl::InvalidArgumentError(absl::StrCat("region_offset ", region_offset, " + ", bytes,
                                                   " bytes is outside region \"", region, "\" (",
                                                   pin->size(), " bytes)"));
  }
  if (bytes > 0) RETURN_IF_ERROR(reader->Read(offset, bytes, pin->data() + region_offset));
  return RegionRead{reader->info(), bytes};
}

absl::StatusOr<std::unique_ptr<TenantRuntime::RegionPin>> TenantRuntime::PinRegion(
    absl::string_view handle) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  auto it = regions_.find(handle);
  if (it == regions_.end()) return RegionNotFound(handle);
  it->second->info.transfers++;
  return std::make_unique<RegionPin>(this, it->second);
}

}  // namespace tessera
