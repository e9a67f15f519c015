#ifndef TESSERA_SERVER_CORE_TENANT_TABLE_H_
#define TESSERA_SERVER_CORE_TENANT_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

#include "server/backend/backend.h"
#include "server/common/tenant.h"
#include "server/core/admission.h"
#include "server/core/job_scheduler.h"
#include "server/core/memory_ledger.h"
#include "server/core/tenant_directory.h"
#include "server/core/tenant_runtime.h"
#include "server/store/tenant_store.h"

namespace tessera {

/// A consistent copy of one tenant, safe to hold after the call returns.
struct TenantView {
  TenantRecord record;
  ContextInfo context;
  /// The node the tenant lives on in a fleet (TenantDirectory::node_name); empty on a single
  /// server.
  std::string home_node;
};

/// The tenant table: registration with admission, durable state, contexts, credentials.
/// The one core object the admin and compute adapters go through.
///
/// Thread-safe. Reads (Get, List, AuthenticateKey) never wait for disk or device work;
/// mutations are serialized among themselves and may block on a durable commit and on
/// context creation, so callers keep them off latency-sensitive threads.
class TenantTable final : public TenantDirectory::Members {
 public:
  struct Options {
    /// Reservable memory = device capacity × memory_overcommit (> 0).
    double memory_overcommit = 1.0;
    /// Overrides every device's DeviceInfo::max_in_flight when > 0.
    uint32_t device_in_flight = 0;
    /// Tenant-defined kernels per tenant (DefineKernel refuses more).
    size_t max_kernels_per_tenant = 64;
    /// The fleet's directory (not owned; outlives the table), or null on a single server:
    /// Register, Update, RotateKey and Deregister write it before the local store.
    TenantDirectory* directory = nullptr;
  };

  /// Restores every stored tenant and rebuilds its context. `store` and `backend` are not
  /// owned and must outlive the table.
  static absl::StatusOr<std::unique_ptr<TenantTable>> Create(Options options, TenantStore* store,
                                                             Backend* backend);
  ~TenantTable() override;

  struct Registered {
    TenantView tenant;
    /// The tenant's API key; the only time it exists outside the caller.
    std::string api_key;
  };
  /// Validates, admits, creates the context, commits. See tenant_admin.proto for errors.
  absl::StatusOr<Registered> Register(TenantSpec spec) ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);

  absl::StatusOr<TenantView> Get(absl::string_view id) const ABSL_LOCKS_EXCLUDED(mu_);
  /// The runtime of tenant `id`: NOT_FOUND for an unknown tenant, UNAVAILABLE once
  /// ReleaseContexts ran (a runtime already held then refuses calls with UNAVAILABLE too).
  absl::StatusOr<std::shared_ptr<TenantRuntime>> RuntimeOf(absl::string_view id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  struct Page {
    std::vector<TenantView> tenants;
    /// Id of the last tenant returned when more follow; empty on the last page.
    std::string last_id;
    size_t total = 0;
  };
  /// Up to `limit` tenants with id > `after`, ordered by id.
  Page List(absl::string_view after, size_t limit) const ABSL_LOCKS_EXCLUDED(mu_);

  struct MetadataUpdate {
    std::optional<std::string> display_name;
    std::optional<Labels> labels;
    /// A quota sent with the update: refused unless equal to the registered one.
    std::optional<Quota> quota;
    /// The caller named a quota field explicitly: always refused.
    bool quota_named = false;
  };
  /// NOT_FOUND, INVALID_ARGUMENT, or FAILED_PRECONDITION for any quota change.
  absl::StatusOr<TenantView> Update(absl::string_view id, const MetadataUpdate& update)
      ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);

  struct Deregistered {
    TenantView tenant;
    uint64_t released_memory_bytes = 0;
  };
  /// Revokes the key, commits the removal, then releases the context.
  absl::StatusOr<Deregistered> Deregister(absl::string_view id)
      ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);

  struct RotatedKey {
    std::string api_key;
    absl::Time key_create_time;
  };
  /// The old key is refused as soon as this returns.
  absl::StatusOr<RotatedKey> RotateKey(absl::string_view id) ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);

  /// The runtime of the tenant a valid API key belongs to; UNAUTHENTICATED otherwise (the
  /// same message for an unknown tenant and a wrong secret, so keys reveal nothing). The
  /// runtime may be held past deregistration; it then refuses every call.
  absl::StatusOr<std::shared_ptr<TenantRuntime>> AuthenticateKey(absl::string_view key) const
      ABSL_LOCKS_EXCLUDED(mu_);
  /// The same, for a caller that already computed HashCredential(key).
  absl::StatusOr<std::shared_ptr<TenantRuntime>> AuthenticateKey(absl::string_view key,
                                                                 const KeyHash& hash) const
      ABSL_LOCKS_EXCLUDED(mu_);

  /// Compiles a tenant's kernel definition, commits it durably, and adds it to the tenant's
  /// library. INVALID_ARGUMENT (the definition), ALREADY_EXISTS (the tenant has the name),
  /// RESOURCE_EXHAUSTED (max_kernels_per_tenant), FAILED_PRECONDITION (being deregistered).
  /// Blocks on a durable commit: keep it off latency-sensitive threads.
  absl::StatusOr<KernelLibrary::Kernel> DefineKernel(TenantRuntime& runtime,
                                                     kernels::expr::Definition definition)
      ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);
  /// NOT_FOUND when the tenant has no kernel of that name (whoever else has one).
  absl::Status DeleteKernel(TenantRuntime& runtime, absl::string_view name)
      ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);

  /// Per device: its info, reserved bytes and tenant count.
  std::vector<DeviceLoad> DeviceLoads() const ABSL_LOCKS_EXCLUDED(mu_);
  /// Tenants placed on each device (index: device).
  std::vector<uint32_t> TenantsPerDevice() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  /// Closes every tenant runtime (cancels queued jobs, waits for running ones, frees tensors,
  /// releases contexts) at shutdown. The durable table is untouched; later calls fail with
  /// UNAVAILABLE.
  void ReleaseContexts() ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);

  // TenantDirectory::Members: a fleet's directory moves tenants between nodes.
  std::vector<std::string> LocalTenantIds() const override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<TenantRecord> LocalRecord(absl::string_view id) const override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Adopt(TenantRecord record, absl::string_view note,
                     absl::FunctionRef<absl::Status(const TenantRecord&)> claim) override
      ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);
  void Forget(absl::string_view id, absl::string_view why) override
      ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);

  /// The message of every refused quota change.
  static absl::Status QuotaImmutableError(absl::string_view id);

 private:
  struct Entry {
    TenantRecord record;
    std::shared_ptr<TenantRuntime> runtime;  // owns the context
  };

  TenantTable(Options options, TenantStore* store, Backend* backend)
      : options_(options), store_(store), backend_(backend) {}

  absl::Status Restore() ABSL_LOCKS_EXCLUDED(mutation_mu_, mu_);
  /// Loads the stored kernel definitions into the restored tenants' libraries.
  absl::Status RestoreKernels() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutation_mu_);
  std::vector<DeviceLoad> DeviceLoadsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  /// Copy of the record of `id`, or NOT_FOUND.
  absl::StatusOr<TenantRecord> RecordOf(absl::string_view id) const ABSL_LOCKS_EXCLUDED(mu_);
  TenantView ViewOf(const Entry& entry) const;

  const Options options_;
  TenantStore* const store_;
  Backend* const backend_;

  // Serializes mutations end to end (validation, commit, context work). Taken before mu_.
  absl::Mutex mutation_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Guards the in-memory table; held only for map operations and copies.
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>, std::less<>> tenants_ ABSL_GUARDED_BY(mu_);
  // Deregistered tenants whose memory is not free yet: their reservations still count.
  struct Draining {
    int device = 0;
    uint64_t bytes = 0;
    std::shared_ptr<MemoryLedger> ledger;
  };
  std::vector<Draining> draining_ ABSL_GUARDED_BY(mu_);
  // Releases every tenant's jobs; shared with the runtimes (set once in Create).
  std::shared_ptr<JobScheduler> scheduler_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_TENANT_TABLE_H_
