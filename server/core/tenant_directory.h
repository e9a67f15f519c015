#ifndef TESSERA_SERVER_CORE_TENANT_DIRECTORY_H_
#define TESSERA_SERVER_CORE_TENANT_DIRECTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "server/common/tenant.h"
#include "server/core/token.h"

namespace tessera {

/// One device of a fleet's node, as the node last published it.
struct FleetDevice {
  int index = 0;
  std::string name;
  uint64_t memory_bytes = 0;
  /// Memory not reserved by tenants' quotas (capacity × overcommit − reserved).
  uint64_t free_memory_bytes = 0;
  uint32_t tenants = 0;
  /// The compute shares of its tenants, summed (may pass 100: shares are per-client limits).
  uint32_t share_percent = 0;
  /// The MPS client limit (0: none).
  uint32_t context_limit = 0;
};

/// A live node of the fleet.
struct FleetNode {
  std::string name;
  /// host:port clients and other nodes reach it at.
  std::string address;
  std::string backend;
  std::vector<FleetDevice> devices;
  bool draining = false;
  absl::Time started;
};

/// Where a tenant of the fleet lives, as the directory says.
struct TenantHome {
  /// The tenant's API key hash: a redirect is only for a caller holding the key.
  KeyHash key_hash{};
  std::string node;
  /// The home node's address; empty when that node is not live.
  std::string address;
};

/// A tenant as the fleet's directory has it.
struct FleetTenant {
  TenantRecord record;
  std::string home_node;
};

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

  /// What the directory asks of the node's own tenants (TenantTable), to move tenants between
  /// nodes: adopting those of a lost or drained node, forgetting those that moved away.
  /// Called from the directory's thread, never while it holds a lock a TenantTable call
  /// could need.
  class Members {
   public:
    virtual ~Members() = default;
    /// The ids of the tenants this node serves.
    virtual std::vector<std::string> LocalTenantIds() const = 0;
    /// The record of local tenant `id` (to publish one the directory lacks).
    virtual absl::StatusOr<TenantRecord> LocalRecord(absl::string_view id) const = 0;
    /// Takes on tenant `record` (id, quotas, key hash kept), whose home `from` was lost or
    /// drained: admits it on a device here and creates its context, then calls `claim`
    /// (the directory's transaction making this node its home) and commits it locally only
    /// if that succeeds. `note` explains the move to the tenant's calls for handles from
    /// before it. ALREADY_EXISTS when the id is here already; admission's errors otherwise.
    virtual absl::Status Adopt(TenantRecord record, absl::string_view note,
                               absl::FunctionRef<absl::Status(const TenantRecord&)> claim) = 0;
    /// Drops local tenant `id`, which the directory homes elsewhere now or no longer has:
    /// from the local store and memory; calls holding it fail with `why`. Idempotent.
    virtual void Forget(absl::string_view id, absl::string_view why) = 0;
  };
  /// Connects the node's tenants (not owned) once they are restored, and reconciles them
  /// with the directory before the node serves: local tenants homed elsewhere now are
  /// forgotten; at a node's first join, local tenants the directory lacks (a single server
  /// turned into a node) are published. null detaches (before `members` is destroyed),
  /// waiting for a reconciliation in progress.
  virtual absl::Status Attach(Members* members) = 0;

  /// Records a new tenant homed at this node. ALREADY_EXISTS when the id is taken anywhere in
  /// the fleet; UNAVAILABLE, naming the store, when it cannot be reached.
  virtual absl::Status Create(const TenantRecord& record) = 0;
  /// Replaces the record of a tenant homed here (metadata, a rotated key).
  virtual absl::Status Update(const TenantRecord& record) = 0;
  /// Removes a tenant homed here (NOT_FOUND is not an error: it is gone either way).
  virtual absl::Status Remove(absl::string_view id) = 0;
  /// This node's name: the home of the tenants it serves.
  virtual const std::string& node_name() const = 0;
  /// Where the directory lives, for GetServerInfo ("etcd http://HOST:PORT,...").
  virtual std::string where() const = 0;
  /// Every live node, by name. UNAVAILABLE naming the store when it cannot be reached.
  virtual absl::StatusOr<std::vector<FleetNode>> Nodes() = 0;
  /// Marks node `name` draining (or not): placement skips it. With `move`, its tenants are
  /// also moved to other nodes (placed like new ones, ids, quotas and keys kept, tensors and
  /// jobs lost); a node that is not live may be drained only so. NOT_FOUND for no node of
  /// that name; UNAVAILABLE when the store cannot be reached.
  virtual absl::Status SetDraining(absl::string_view name, bool draining, bool move) = 0;
  /// Every tenant of the fleet, by id, with its home node. UNAVAILABLE when the store cannot
  /// be reached.
  virtual absl::StatusOr<std::vector<FleetTenant>> Tenants() = 0;
  /// Publishes this node's capacity now (after a registration or deregistration changed it),
  /// not only at the next lease renewal, so placements elsewhere see it. Best effort.
  virtual void CapacityChanged() = 0;
  /// Where tenant `id` lives, if the fleet has it (answers may be a few seconds old).
  virtual absl::StatusOr<std::optional<TenantHome>> FindTenant(absl::string_view id) = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_TENANT_DIRECTORY_H_
