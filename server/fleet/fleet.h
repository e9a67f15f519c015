#ifndef TESSERA_SERVER_FLEET_FLEET_H_
#define TESSERA_SERVER_FLEET_FLEET_H_

// One server as a node of a fleet whose directory lives in etcd (docs/fleet.md): the node's
// entry under a lease it keeps alive, and the tenants homed here, written to etcd before
// they are acknowledged.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#include "server/core/admission.h"
#include "server/core/tenant_directory.h"
#include "server/fleet/etcd_client.h"

namespace tessera::fleet {

using DeviceCapacity = FleetDevice;
using NodeRecord = FleetNode;

class Fleet final : public TenantDirectory {
 public:
  struct Options {
    std::vector<std::string> etcd_endpoints;
    std::string node_name;
    std::string advertise_address;
    std::string backend;
    /// The node's lease: it leaves the fleet this long after its last renewal.
    absl::Duration lease_ttl = absl::Seconds(10);
    /// Every key of the fleet starts with this.
    std::string prefix = "/tessera/v1/";
    absl::Duration etcd_timeout = absl::Seconds(3);
    /// Where a lost or drained node's tenants go (--fleet_placement).
    Placement placement = Placement::kSpread;
  };

  /// Joins: grants the node's lease and creates its entry. FAILED_PRECONDITION when a live
  /// node already has the name; UNAVAILABLE when etcd cannot be reached. `capacity` is asked
  /// for the node's devices at every renewal (from the renewing thread).
  static absl::StatusOr<std::unique_ptr<Fleet>> Join(
      Options options, std::function<std::vector<DeviceCapacity>()> capacity);
  /// Leaves: stops renewing, marks the node away on purpose (`<prefix>away/<name>`: its
  /// tenants are not moved while it is stopped) and revokes the lease (the entry goes at once).
  ~Fleet() override;

  /// Reconciles `members` at once (TenantDirectory::Attach), then at every scan: forgets
  /// local tenants homed elsewhere, and adopts the tenants of nodes lost (not live for
  /// Grace() past their lease, and not away on purpose) or drained with --move, where
  /// placement picks this node.
  absl::Status Attach(Members* members) override;
  /// How long a node must be gone before its tenants move, and how long a node must have been
  /// joined (or have reached etcd again after an outage) before it adopts any: a quarter of
  /// the lease TTL, 1 s to 5 s.
  absl::Duration Grace() const;

  absl::StatusOr<std::vector<FleetNode>> Nodes() override;
  std::string where() const override { return "etcd " + etcd_->endpoints(); }
  /// Cached for kHomeCacheTtl (found or not), so that calls with keys of other nodes'
  /// tenants, or made-up ones, do not each ask etcd.
  absl::StatusOr<std::optional<TenantHome>> FindTenant(absl::string_view id) override;
  void CapacityChanged() override;
  /// `<prefix>drain/<name>` while draining ("move" when its tenants are to move); the node
  /// reads it at every renewal.
  absl::Status SetDraining(absl::string_view name, bool draining, bool move) override;
  absl::StatusOr<std::vector<FleetTenant>> Tenants() override;
  static constexpr absl::Duration kHomeCacheTtl = absl::Seconds(2);

  // TenantDirectory: `<prefix>tenants/<id>`, created only if absent.
  absl::Status Create(const TenantRecord& record) override;
  absl::Status Update(const TenantRecord& record) override;
  absl::Status Remove(absl::string_view id) override;
  const std::string& node_name() const override { return options_.node_name; }

  /// The etcd endpoints, for messages.
  const std::string& etcd() const { return etcd_->endpoints(); }

 private:
  Fleet(Options options, std::unique_ptr<EtcdClient> etcd,
        std::function<std::vector<DeviceCapacity>()> capacity);

  std::string NodeKey() const { return options_.prefix + "nodes/" + options_.node_name; }
  std::string TenantKey(absl::string_view id) const;
  std::string NodeJson() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// Grants a lease and creates the node's entry on it; FAILED_PRECONDITION when the name is
  /// taken by a live node.
  absl::Status Register() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// Renews the lease every third of its TTL; registers again when it expired (etcd was away
  /// longer than the TTL), and keeps trying while etcd is unreachable. Reconciles the members
  /// every scan interval (at most 1 s).
  void RenewLoop();
  /// One pass of Attach's reconciliation; `attaching` for the first (publishes local tenants
  /// the directory lacks at a node's first join).
  absl::Status ReconcileLocked(bool attaching) ABSL_EXCLUSIVE_LOCKS_REQUIRED(members_mu_);

  const Options options_;
  const std::unique_ptr<EtcdClient> etcd_;
  const std::function<std::vector<DeviceCapacity>()> capacity_;
  const absl::Time started_;

  absl::Mutex mu_;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether `<prefix>drain/<this node>` existed at the last renewal.
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;

  struct CachedHome {
    std::optional<TenantHome> home;
    absl::Time expires;
  };
  // The node's tenants, and what reconciliation remembers between passes.
  absl::Mutex members_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  Members* members_ ABSL_GUARDED_BY(members_mu_) = nullptr;
  // Whether this node joined the fleet for the first time (no `<prefix>known/<name>`).
  bool first_join_ = false;
  // When each node not live was first seen gone, and each orphaned tenant first seen.
  std::map<std::string, absl::Time> gone_since_ ABSL_GUARDED_BY(members_mu_);
  std::map<std::string, absl::Time> orphan_since_ ABSL_GUARDED_BY(members_mu_);
  // Whether the last reconciliation could not read etcd, and when it could again.
  bool etcd_lost_ ABSL_GUARDED_BY(members_mu_) = false;
  absl::Time settled_since_ ABSL_GUARDED_BY(members_mu_) = absl::InfinitePast();

  absl::Mutex cache_mu_;
  std::map<std::string, CachedHome, std::less<>> homes_ ABSL_GUARDED_BY(cache_mu_);
  std::thread renewer_;
};

/// The JSON a tenant is kept as in etcd, and back. INVALID_ARGUMENT naming the field for a
/// value that is not one.
/// `moved_from`: the node it was moved from (empty: none), kept for the record.
std::string TenantJson(const TenantRecord& record, absl::string_view home,
                       absl::string_view moved_from = "");
absl::StatusOr<TenantRecord> TenantFromJson(absl::string_view json, std::string* home);
std::string NodeRecordJson(const NodeRecord& node);
absl::StatusOr<NodeRecord> NodeRecordFromJson(absl::string_view json);

}  // namespace tessera::fleet

#endif  // TESSERA_SERVER_FLEET_FLEET_H_
