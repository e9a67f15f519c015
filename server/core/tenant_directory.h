#ifndef TESSERA_SERVER_CORE_TENANT_DIRECTORY_H_
#define TESSERA_SERVER_CORE_TENANT_DIRECTORY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "server/core/tenant.h"

namespace tessera {

/// The fleet's tenant directory (server/fleet: etcd), when the server is one node of a fleet;
/// a single server has none. TenantTable writes a tenant there before it commits the tenant
/// locally, so no id is registered twice across the fleet and nothing is acknowledged before
/// the directory has committed it.
///
/// Thread-safe. Calls may block on the store (bounded by its timeout): TenantTable makes them
/// from its mutations, which are off latency-sensitive threads already.
class TenantDirectory {
 public:
  virtual ~TenantDirectory() = default;

  /// Records a new tenant homed at this node. ALREADY_EXISTS when the id is taken anywhere in
  /// the fleet; UNAVAILABLE, naming the store, when it cannot be reached.
  virtual absl::Status Create(const TenantRecord& record) = 0;
  /// Replaces the record of a tenant homed here (metadata, a rotated key).
  virtual absl::Status Update(const TenantRecord& record) = 0;
  /// Removes a tenant homed here (NOT_FOUND is not an error: it is gone either way).
  virtual absl::Status Remove(absl::string_view id) = 0;
  /// This node's name: the home of the tenants it serves.
  virtual const std::string& node_name() const = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_TENANT_DIRECTORY_H_
