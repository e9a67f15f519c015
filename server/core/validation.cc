#include "server/core/validation.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "server/common/status_macros.h"

namespace tessera {
namespace {

bool IsLowerAlnum(char c) { return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'z'); }

bool HasControlCharacter(absl::string_view s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

// Quotes user input for an error message, bounded so a huge value cannot bloat the reply.
std::string Quote(absl::string_view s) {
  constexpr size_t kMax = 80;
  if (s.size() <= kMax) return absl::StrCat("\"", absl::CHexEscape(s), "\"");
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMax)), "...\"");
}

}  // namespace

absl::Status ValidateTenantId(absl::string_view id, absl::string_view field) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is required"));
  if (id.size() > kMaxTenantIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", id.size(), " characters; the limit is ", kMaxTenantIdLength));
  }
  for (char c : id) {
    if (!IsLowerAlnum(c) && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " ", Quote(id),
                       " may contain only lowercase letters, digits and '-' (DNS label)"));
    }
  }
  if (!IsLowerAlnum(id.front()) || !IsLowerAlnum(id.back())) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " ", Quote(id), " must start and end with a lowercase letter or digit"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDisplayName(absl::string_view name) {
  if (name.size() > kMaxDisplayNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("display_name is ", name.size(),
                                                   " bytes; the limit is ", kMaxDisplayNameBytes));
  }
  if (HasControlCharacter(name)) {
    return absl::InvalidArgumentError("display_name may not contain control characters");
  }
  return absl::OkStatus();
}

absl::Status ValidateLabels(const Labels& labels) {
  if (labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("labels has ", labels.size(), " entries; the limit is ", kMaxLabels));
  }
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > kMaxLabelKeyLength) {
      return absl::InvalidArgumentError(absl::StrCat("labels key ", Quote(key), " must be 1..",
                                                     kMaxLabelKeyLength, " characters"));
    }
    for (char c : key) {
      if (!IsLowerAlnum(c) && c != '-' && c != '_' && c != '.') {
        return absl::InvalidArgumentError(
            absl::StrCat("labels key ", Quote(key), " may contain only [a-z0-9._-]"));
      }
    }
    if (!IsLowerAlnum(key.front()) || !IsLowerAlnum(key.back())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels key ", Quote(key), " must start and end with a lowercase letter or digit"));
    }
    if (value.size() > kMaxLabelValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat("labels[", key, "] is ", value.size(),
                                                     " bytes; the limit is ", kMaxLabelValueBytes));
    }
    if (HasControlCharacter(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("labels[", key, "] may not contain control characters"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Quota> NormalizeQuota(const Quota& requested) {
  Quota q = requested;
  if (q.compute_share_percent == 0) q.compute_share_percent = kDefaultComputeSharePercent;
  if (q.max_streams == 0) q.max_streams = kDefaultMaxStreams;
  if (q.max_queued_jobs == 0) q.max_queued_jobs = kDefaultMaxQueuedJobs;
  if (q.max_requests_in_flight == 0) q.max_requests_in_flight = kDefaultMaxRequestsInFlight;

  if (q.device_memory_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota.device_memory_bytes is required (at least %d bytes = 1 MiB)",
                        kMinDeviceMemoryBytes));
  }
  if (q.device_memory_bytes < kMinDeviceMemoryBytes ||
      q.device_memory_bytes > kMaxDeviceMemoryBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota.device_memory_bytes is %d; the range is %d (1 MiB) .. %d (1 PiB)",
                        q.device_memory_bytes, kMinDeviceMemoryBytes, kMaxDeviceMemoryBytes));
  }
  if (q.compute_share_percent > kMaxComputeSharePercent) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota.compute_share_percent is %d; the range is 1..%d",
                        q.compute_share_percent, kMaxComputeSharePercent));
  }
  if (q.max_streams > kMaxStreams) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota.max_streams is %d; the range is 1..%d", q.max_streams, kMaxStreams));
  }
  if (q.max_queued_jobs > kMaxQueuedJobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "quota.max_queued_jobs is %d; the range is 1..%d", q.max_queued_jobs, kMaxQueuedJobs));
  }
  if (q.max_requests_in_flight > kMaxRequestsInFlight) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota.max_requests_in_flight is %d; the range is 1..%d",
                        q.max_requests_in_flight, kMaxRequestsInFlight));
  }
  // Derived from the share only once the share is known to be in range.
  if (q.requests_per_second == 0) {
    q.requests_per_second = DefaultRequestsPerSecond(q.compute_share_percent);
  }
  if (q.requests_per_second > kMaxRequestsPerSecond) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota.requests_per_second is %d; the range is 1..%d",
                        q.requests_per_second, kMaxRequestsPerSecond));
  }
  if (q.max_region_bytes == 0) q.max_region_bytes = q.device_memory_bytes;
  if (q.max_region_bytes < kMinRegionBytes || q.max_region_bytes > kMaxRegionBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota.max_region_bytes is %d; the range is %d (1 MiB) .. %d (1 PiB)",
                        q.max_region_bytes, kMinRegionBytes, kMaxRegionBytes));
  }
  if (q.priority != Priority::kNormal && q.priority != Priority::kLow) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota.priority is %d; allowed: PRIORITY_NORMAL (1), PRIORITY_LOW (2)",
                        static_cast<int>(q.priority)));
  }
  return q;
}

absl::StatusOr<TenantSpec> ValidateTenantSpec(TenantSpec spec) {
  RETURN_IF_ERROR(ValidateTenantId(spec.id));
  RETURN_IF_ERROR(ValidateDisplayName(spec.display_name));
  RETURN_IF_ERROR(ValidateLabels(spec.labels));
  ASSIGN_OR_RETURN(spec.quota, NormalizeQuota(spec.quota));
  if (spec.device_index.has_value() && *spec.device_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_index is ", *spec.device_index, "; it must be >= 0"));
  }
  return spec;
}

}  // namespace tessera
