#ifndef TESSERA_SERVER_CORE_VALIDATION_H_
#define TESSERA_SERVER_CORE_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "server/common/tenant.h"

namespace tessera {

// Limits of the tenant model. The proto comments (proto/tessera/v1/tenant_admin.proto)
// state the same numbers; keep them in step.
inline constexpr uint64_t kMinDeviceMemoryBytes = uint64_t{1} << 20;  // 1 MiB
inline constexpr uint64_t kMaxDeviceMemoryBytes = uint64_t{1} << 50;  // 1 PiB
inline constexpr uint32_t kDefaultComputeSharePercent = 100;
inline constexpr uint32_t kMaxComputeSharePercent = 100;
inline constexpr uint32_t kDefaultMaxStreams = 4;
inline constexpr uint32_t kMaxStreams = 64;
inline constexpr uint32_t kDefaultMaxQueuedJobs = 1024;
inline constexpr uint32_t kMaxQueuedJobs = 65536;
inline constexpr uint32_t kDefaultMaxRequestsInFlight = 64;
inline constexpr uint32_t kMaxRequestsInFlight = 4096;
/// The default request rate is this many requests per second per percent of compute share
/// (100 % → 1,000,000/s; 5 % → 50,000/s): above what one tenant's clients send in normal
/// use on any machine we measured (a 2-core server answers ~20,000 tiny calls a second), so
/// the default protects against floods without ever capping ordinary work. A bucket is not
/// work-conserving: an operator who wants a hard cap sets the field.
inline constexpr uint32_t kDefaultRequestsPerSecondPerSharePercent = 10000;
/// The default quota.requests_per_second for a share (0: the default share).
inline constexpr uint32_t DefaultRequestsPerSecond(uint32_t compute_share_percent) {
  return kDefaultRequestsPerSecondPerSharePercent *
         (compute_share_percent != 0 ? compute_share_percent : kDefaultComputeSharePercent);
}
inline constexpr uint32_t kMaxRequestsPerSecond = 1'000'000;
inline constexpr uint64_t kMinRegionBytes = uint64_t{1} << 20;  // 1 MiB
inline constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 50;  // 1 PiB
/// Shared-memory regions one tenant may hold at once (also bounds the server's mappings).
inline constexpr size_t kMaxRegionsPerTenant = 1024;
inline constexpr size_t kMaxTenantIdLength = 63;
inline constexpr size_t kMaxDisplayNameBytes = 256;
inline constexpr size_t kMaxLabels = 64;
inline constexpr size_t kMaxLabelKeyLength = 63;
inline constexpr size_t kMaxLabelValueBytes = 256;

/// INVALID_ARGUMENT naming `field` unless `id` is a DNS label (1..63 of [a-z0-9-],
/// starting and ending with a letter or digit).
absl::Status ValidateTenantId(absl::string_view id, absl::string_view field = "tenant_id");

absl::Status ValidateDisplayName(absl::string_view name);
absl::Status ValidateLabels(const Labels& labels);

/// Fills the defaults of unset (zero) fields, then checks every field's range. The result
/// is what gets stored; errors are INVALID_ARGUMENT naming the field and its limit.
absl::StatusOr<Quota> NormalizeQuota(const Quota& requested);

/// Validates a whole registration (id, name, labels, quota) and returns it with the quota
/// normalized. Device placement is checked by admission, which knows the devices.
absl::StatusOr<TenantSpec> ValidateTenantSpec(TenantSpec spec);

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_VALIDATION_H_
