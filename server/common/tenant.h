#ifndef TESSERA_SERVER_COMMON_TENANT_H_
#define TESSERA_SERVER_COMMON_TENANT_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/time/time.h"

// The words every layer shares about tenants (docs/architecture.md, "Layers"): what a tenant
// is and may use. Plain data; the core validates and admits it, the store keeps it, backends
// size contexts from it, the adapters convert it.
namespace tessera {

/// SHA-256 of a credential. Only hashes are kept; a credential carries 256 random bits, so
/// a fast hash is enough (there is nothing to brute-force). (server/core/token.h makes them.)
using KeyHash = std::array<uint8_t, 32>;

enum class Priority { kNormal = 1, kLow = 2 };

/// A tenant's resource limits. Immutable once the tenant is registered.
struct Quota {
  uint64_t device_memory_bytes = 0;
  uint32_t compute_share_percent = 0;
  uint32_t max_streams = 0;
  uint32_t max_queued_jobs = 0;
  Priority priority = Priority::kNormal;
  /// Requests the server handles for the tenant at once (RequestGate); 0 before defaults.
  uint32_t max_requests_in_flight = 0;
  /// The tenant's request rate limit, per second (token bucket); 0 before defaults.
  uint32_t requests_per_second = 0;
  /// Bytes of shared-memory regions mapped at once; 0 before defaults (device_memory_bytes).
  uint64_t max_region_bytes = 0;

  friend bool operator==(const Quota&, const Quota&) = default;
};

using Labels = std::map<std::string, std::string>;

/// What an operator asks for when registering a tenant (validated by ValidateTenantSpec).
struct TenantSpec {
  std::string id;
  std::string display_name;
  Labels labels;
  Quota quota;
  std::optional<int> device_index;
};

/// The durable part of a tenant: exactly what the store keeps.
struct TenantRecord {
  std::string id;
  std::string display_name;
  Labels labels;
  Quota quota;
  int device_index = 0;
  absl::Time create_time;
  absl::Time update_time;
  absl::Time key_create_time;
  KeyHash key_hash{};

  friend bool operator==(const TenantRecord&, const TenantRecord&) = default;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMON_TENANT_H_
