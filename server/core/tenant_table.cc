#include "server/core/tenant_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "kernels/expr/compile.h"
#include "server/common/logging.h"
#include "server/common/status_macros.h"
#include "server/common/telemetry.h"
#include "server/core/token.h"
#include "server/core/validation.h"

namespace tessera {
namespace {

// The store keeps microseconds; minting times at that precision keeps a restored tenant
// identical to the one that was registered.
absl::Time NowMicros() { return absl::FromUnixMicros(absl::ToUnixMicros(absl::Now())); }

}  // namespace

absl::StatusOr<std::unique_ptr<TenantTable>> TenantTable::Create(Options options,
                                                                 TenantStore* store,
                                                                 Backend* backend) {
  if (!(options.memory_overcommit > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_overcommit is ", options.memory_overcommit, "; it must be > 0"));
  }
  std::unique_ptr<TenantTable> table(new TenantTable(options, store, backend));
  JobScheduler::Options scheduling{.stream_in_flight = std::max(1, backend->stream_in_flight())};
  for (const DeviceInfo& device : backend->devices()) {
    scheduling.device_in_flight.push_back(static_cast<int>(
        options.device_in_flight > 0 ? options.device_in_flight : device.max_in_flight));
  }
  table->scheduler_ = JobScheduler::Create(std::move(scheduling));
  RETURN_IF_ERROR(table->Restore());
  if (options.directory != nullptr) RETURN_IF_ERROR(options.directory->Attach(table.get()));
  return table;
}

TenantTable::~TenantTable() {
  if (options_.directory != nullptr) (void)options_.directory->Attach(nullptr);
  ReleaseContexts();
}

absl::Status TenantTable::QuotaImmutableError(absl::string_view id) {
  return absl::FailedPreconditionError(absl::StrCat(
      "quota of tenant \"", id,
      "\" is immutable once registered; to change it, deregister the tenant and register it "
      "again with the new quota (its tensors are released)"));
}

TenantView TenantTable::ViewOf(const Entry& entry) const {
  return TenantView{
      entry.record, entry.runtime->context_info(),
      options_.directory != nullptr ? options_.directory->node_name() : std::string()};
}

absl::Status TenantTable::Restore() {
  absl::MutexLock mutation(&mutation_mu_);
  ASSIGN_OR_RETURN(std::vector<TenantRecord> records, store_->LoadAll());
  const std::vector<DeviceInfo>& devices = backend_->devices();
  for (TenantRecord& record : records) {
    // A quota is checked when it is registered; a stored one could still be out of bounds (a
    // file edited or damaged outside Tessera), and contexts are built from it: refuse to start
    // rather than let it abort the server or take all of its memory.
    absl::StatusOr<Quota> quota = NormalizeQuota(record.quota);
    if (!quota.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("restore: tenant \"", record.id, "\" has a stored quota out of bounds (",
                       quota.status().message(),
                       "); the state file was changed outside Tessera: deregister the tenant ",
                       "with an older state file or restore a backup"));
    }
    if (!(*quota == record.quota)) {
      // Stored by a version that had fewer quota fields: the new ones get their defaults.
      record.quota = *std::move(quota);
      RETURN_IF_ERROR(store_->Update(record));
    }
    if (record.device_index < 0 || static_cast<size_t>(record.device_index) >= devices.size()) {
      // The device is gone (e.g. a GPU removed): place the tenant again and persist it.
      std::vector<DeviceLoad> loads;
      {
        absl::ReaderMutexLock lock(&mu_);
        loads = DeviceLoadsLocked();
      }
      absl::StatusOr<int> device = ChooseDevice(loads, options_.memory_overcommit,
                                                record.quota.device_memory_bytes, std::nullopt);
      int placed = device.ok() ? *device : 0;
      spdlog::warn(
          "restore: tenant {} was on device {}, which this host does not have; "
          "placing it on device {}{}",
          record.id, record.device_index, placed,
          device.ok() ? "" : absl::StrCat(" although ", device.status().message()));
      record.device_index = placed;
      RETURN_IF_ERROR(store_->Update(record));
    }
    absl::StatusOr<std::unique_ptr<TenantContext>> context =
        backend_->CreateContext(ContextRequest{record.id, record.quota, record.device_index});
    if (!context.ok()) {
      return absl::Status(context.status().code(),
                          absl::StrCat("restore: cannot rebuild the context of tenant \"",
                                       record.id, "\": ", context.status().message()));
    }
    auto entry = std::make_unique<Entry>();
    entry->runtime = std::make_shared<TenantRuntime>(record.id, record.quota, *std::move(context),
                                                     scheduler_, record.device_index);
    entry->record = std::move(record);
    absl::MutexLock lock(&mu_);
    std::string id = entry->record.id;
    tenants_.emplace(std::move(id), std::move(entry));
  }
  RETURN_IF_ERROR(RestoreKernels());
  absl::ReaderMutexLock lock(&mu_);
  for (const DeviceLoad& load : DeviceLoadsLocked()) {
    uint64_t reservable = ReservableBytes(load.device.memory_bytes, options_.memory_overcommit);
    if (load.reserved_bytes > reservable) {
      spdlog::warn(
          "restore: device {} has {} reserved but only {} reservable; new "
          "registrations on it will be refused until tenants leave",
          load.device.index, FormatBytes(load.reserved_bytes), FormatBytes(reservable));
    }
  }
  return absl::OkStatus();
}

absl::Status TenantTable::RestoreKernels() {
  ASSIGN_OR_RETURN(std::vector<StoredKernel> stored, store_->LoadKernels());
  size_t restored = 0;
  for (const StoredKernel& k : stored) {
    absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime = RuntimeOf(k.tenant_id);
    if (!runtime.ok()) continue;  // the tenant row cascades; cannot happen
    // A definition this version no longer accepts stays stored (a later version may) but is
    // not served; the tenant sees it missing from ListKernels and the log says why.
    absl::StatusOr<kernels::expr::Definition> definition = kernels::expr::ParseSource(k.source);
    absl::StatusOr<std::shared_ptr<const kernels::expr::UserKernel>> kernel =
        definition.ok()
            ? kernels::expr::MakeUserKernel(*std::move(definition))
            : absl::StatusOr<std::shared_ptr<const kernels::expr::UserKernel>>(definition.status());
    if (!kernel.ok()) {
      spdlog::error("restore: kernel {} of tenant {} no longer compiles ({}); not served", k.name,
                    k.tenant_id, kernel.status().message());
      continue;
    }
    RETURN_IF_ERROR((*runtime)->kernels().Add(*std::move(kernel)));
    ++restored;
  }
  if (restored > 0) spdlog::info("restored {} tenant-defined kernel(s)", restored);
  return absl::OkStatus();
}

absl::StatusOr<KernelLibrary::Kernel> TenantTable::DefineKernel(
    TenantRuntime& runtime, kernels::expr::Definition definition) {
  // Compiled before any lock: bounded (kernels/expr/ast.h limits), no I/O.
  ASSIGN_OR_RETURN(KernelLibrary::Kernel kernel,
                   kernels::expr::MakeUserKernel(std::move(definition)));
  const std::string& name = kernel->program.definition.name;
  absl::MutexLock mutation(&mutation_mu_);
  if (runtime.kernels().Find(name) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("kernel \"", name, "\" is already defined; DeleteKernel it first"));
  }
  if (runtime.kernels().size() >= options_.max_kernels_per_tenant) {
    return telemetry::WithRefusalReason(
        absl::ResourceExhaustedError(
            absl::StrCat("tenant ", runtime.tenant_id(), " has ", runtime.kernels().size(),
                         " kernels; the limit is ", options_.max_kernels_per_tenant,
                         " per tenant (--max_kernels_per_tenant): DeleteKernel one first")),
        "kernel_count");
  }
  absl::Status stored = store_->InsertKernel(
      StoredKernel{.tenant_id = runtime.tenant_id(),
                   .name = name,
                   .source = kernels::expr::FormatDefinition(kernel->program.definition),
                   .create_time = absl::Now()});
  if (absl::IsNotFound(stored)) {
    return absl::FailedPreconditionError(
        absl::StrCat("tenant ", runtime.tenant_id(), " is being deregistered"));
  }
  RETURN_IF_ERROR(stored);
  RETURN_IF_ERROR(runtime.kernels().Add(kernel));
  return kernel;
}

absl::Status TenantTable::DeleteKernel(TenantRuntime& runtime, absl::string_view name) {
  absl::MutexLock mutation(&mutation_mu_);
  if (runtime.kernels().Find(name) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("kernel \"", name.substr(0, 64), "\" not found among this tenant's kernels"));
  }
  absl::Status deleted = store_->DeleteKernel(runtime.tenant_id(), name);
  if (!deleted.ok() && !absl::IsNotFound(deleted)) return deleted;
  runtime.kernels().Remove(name);
  return absl::OkStatus();
}

absl::StatusOr<TenantTable::Registered> TenantTable::Register(TenantSpec spec) {
  ASSIGN_OR_RETURN(spec, ValidateTenantSpec(std::move(spec)));
  absl::MutexLock mutation(&mutation_mu_);
  std::vector<DeviceLoad> loads;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (released_) return absl::UnavailableError("the server is shutting down");
    if (tenants_.contains(spec.id)) {
      return absl::AlreadyExistsError(absl::StrCat("tenant_id \"", spec.id, "\" is taken"));
    }
    loads = DeviceLoadsLocked();
  }
  ASSIGN_OR_RETURN(int device, ChooseDevice(loads, options_.memory_overcommit,
                                            spec.quota.device_memory_bytes, spec.device_index));
  ASSIGN_OR_RETURN(std::string api_key, NewTenantKey(spec.id));

  absl::Time now = NowMicros();
  auto entry = std::make_unique<Entry>();
  entry->record = TenantRecord{.id = spec.id,
                               .display_name = std::move(spec.display_name),
                               .labels = std::move(spec.labels),
                               .quota = spec.quota,
                               .device_index = device,
                               .create_time = now,
                               .update_time = now,
                               .key_create_time = now,
                               .key_hash = HashCredential(api_key)};
  // Context first: a committed tenant always has one. If the commit fails, the context is
  // destroyed with `entry` and nothing was recorded.
  ASSIGN_OR_RETURN(std::unique_ptr<TenantContext> context,
                   backend_->CreateContext(ContextRequest{spec.id, spec.quota, device}));
  entry->runtime =
      std::make_shared<TenantRuntime>(spec.id, spec.quota, std::move(context), scheduler_, device);
  // The fleet's directory first: it decides whether the id is free anywhere in the fleet.
  if (options_.directory != nullptr) RETURN_IF_ERROR(options_.directory->Create(entry->record));
  if (absl::Status stored = store_->Insert(entry->record); !stored.ok()) {
    if (options_.directory != nullptr) (void)options_.directory->Remove(spec.id);
    return stored;
  }

  Registered result{ViewOf(*entry), std::move(api_key)};
  absl::MutexLock lock(&mu_);
  tenants_.emplace(spec.id, std::move(entry));
  return result;
}

std::vector<std::string> TenantTable::LocalTenantIds() const {
  std::vector<std::string> ids;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [id, entry] : tenants_) ids.push_back(id);
  return ids;
}

absl::StatusOr<TenantRecord> TenantTable::LocalRecord(absl::string_view id) const {
  return RecordOf(id);
}

absl::Status TenantTable::Adopt(TenantRecord record, absl::string_view note,
                                absl::FunctionRef<absl::Status(const TenantRecord&)> claim) {
  absl::MutexLock mutation(&mutation_mu_);
  ASSIGN_OR_RETURN(record.quota, NormalizeQuota(record.quota));
  std::vector<DeviceLoad> loads;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (released_) return absl::UnavailableError("the server is shutting down");
    if (tenants_.contains(record.id)) {
      return absl::AlreadyExistsError(absl::StrCat("tenant_id \"", record.id, "\" is here"));
    }
    loads = DeviceLoadsLocked();
  }
  // Its old device index names a device of another node: placed here like a new tenant.
  ASSIGN_OR_RETURN(record.device_index,
                   ChooseDevice(loads, options_.memory_overcommit, record.quota.device_memory_bytes,
                                std::nullopt));
  ASSIGN_OR_RETURN(
      std::unique_ptr<TenantContext> context,
      backend_->CreateContext(ContextRequest{record.id, record.quota, record.device_index}));
  auto entry = std::make_unique<Entry>();
  entry->runtime = std::make_shared<TenantRuntime>(record.id, record.quota, std::move(context),
                                                   scheduler_, record.device_index);
  entry->runtime->set_moved_note(std::string(note));
  record.update_time = NowMicros();
  // The directory's transaction decides: another node may have taken the tenant first.
  RETURN_IF_ERROR(claim(record));
  // Served from the moment the directory says it lives here (its clients are sent here).
  entry->record = record;
  {
    absl::MutexLock lock(&mu_);
    tenants_.emplace(record.id, std::move(entry));
  }
  // A row left from an earlier stay here is replaced.
  absl::Status stored = store_->Insert(record);
  if (absl::IsAlreadyExists(stored)) stored = store_->Update(record);
  if (!stored.ok()) {
    // Homed here in the directory: restored from it at the next start (Attach).
    spdlog::error("fleet: tenant {} adopted but not stored locally: {}", record.id,
                  std::string(stored.message()));
  }
  return absl::OkStatus();
}

void TenantTable::Forget(absl::string_view id, absl::string_view why) {
  absl::MutexLock mutation(&mutation_mu_);
  std::unique_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = tenants_.find(id);
    if (it == tenants_.end()) return;
    entry = std::move(it->second);
    tenants_.erase(it);
    std::erase_if(draining_, [](const Draining& d) { return d.ledger->used() == 0; });
    draining_.push_back(Draining{entry->record.device_index,
                                 entry->record.quota.device_memory_bytes,
                                 entry->runtime->ledger()});
  }
  if (absl::Status deleted = store_->Delete(id); !deleted.ok() && !absl::IsNotFound(deleted)) {
    spdlog::error("fleet: forgetting tenant {}: {}", id, std::string(deleted.message()));
  }
  spdlog::warn("fleet: tenant {} {}; no longer served here", id, why);
  entry->runtime->Close(why);
}

absl::StatusOr<TenantView> TenantTable::Get(absl::string_view id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tenants_.find(id);
  if (it == tenants_.end()) {
    return absl::NotFoundError(absl::StrCat("tenant \"", id, "\" not found"));
  }
  return ViewOf(*it->second);
}

absl::StatusOr<std::shared_ptr<TenantRuntime>> TenantTable::RuntimeOf(absl::string_view id) const {
  absl::ReaderMutexLock lock(&mu_);
  if (released_) return absl::UnavailableError("the server is shutting down");
  auto it = tenants_.find(id);
  if (it == tenants_.end()) {
    return absl::NotFoundError(absl::StrCat("tenant \"", id, "\" not found"));
  }
  return it->second->runtime;
}

TenantTable::Page TenantTable::List(absl::string_view after, size_t limit) const {
  Page page;
  absl::ReaderMutexLock lock(&mu_);
  page.total = tenants_.size();
  auto it = after.empty() ? tenants_.begin() : tenants_.upper_bound(after);
  for (; it != tenants_.end() && page.tenants.size() < limit; ++it) {
    page.tenants.push_back(ViewOf(*it->second));
  }
  if (it != tenants_.end() && !page.tenants.empty()) page.last_id = page.tenants.back().record.id;
  return page;
}

absl::StatusOr<TenantRecord> TenantTable::RecordOf(absl::string_view id) const {
  absl::ReaderMutexLock lock(&mu_);
  if (released_) return absl::UnavailableError("the server is shutting down");
  auto it = tenants_.find(id);
  if (it == tenants_.end()) {
    return absl::NotFoundError(absl::StrCat("tenant \"", id, "\" not found"));
  }
  return it->second->record;
}

absl::StatusOr<TenantView> TenantTable::Update(absl::string_view id, const MetadataUpdate& update) {
  absl::MutexLock mutation(&mutation_mu_);
  ASSIGN_OR_RETURN(TenantRecord record, RecordOf(id));
  if (update.quota_named) return QuotaImmutableError(id);
  if (update.quota.has_value()) {
    absl::StatusOr<Quota> sent = NormalizeQuota(*update.quota);
    if (!sent.ok() || *sent != record.quota) return QuotaImmutableError(id);
  }
  if (update.display_name.has_value()) {
    RETURN_IF_ERROR(ValidateDisplayName(*update.display_name));
    record.display_name = *update.display_name;
  }
  if (update.labels.has_value()) {
    RETURN_IF_ERROR(ValidateLabels(*update.labels));
    record.labels = *update.labels;
  }
  record.update_time = NowMicros();
  if (options_.directory != nullptr) RETURN_IF_ERROR(options_.directory->Update(record));
  RETURN_IF_ERROR(store_->Update(record));

  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(id);
  it->second->record = std::move(record);  // present: mutations are serialized
  return ViewOf(*it->second);
}

absl::StatusOr<TenantTable::Deregistered> TenantTable::Deregister(absl::string_view id) {
  absl::MutexLock mutation(&mutation_mu_);
  RETURN_IF_ERROR(RecordOf(id).status());
  if (options_.directory != nullptr) RETURN_IF_ERROR(options_.directory->Remove(id));
  RETURN_IF_ERROR(store_->Delete(id));
  std::unique_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = tenants_.find(id);
    entry = std::move(it->second);
    tenants_.erase(it);
    // The reservation stays until the tenant's memory is really free (a stalled transfer
    // may hold a buffer a little longer than Close): admission never promises it twice.
    // Those that have drained since are dropped here, under the exclusive lock.
    std::erase_if(draining_, [](const Draining& d) { return d.ledger->used() == 0; });
    draining_.push_back(Draining{entry->record.device_index,
                                 entry->record.quota.device_memory_bytes,
                                 entry->runtime->ledger()});
  }
  Deregistered result{ViewOf(*entry), entry->record.quota.device_memory_bytes};
  entry->runtime->Close("is deregistered");  // cancels its work, frees its memory
  entry.reset();
  return result;
}

absl::StatusOr<TenantTable::RotatedKey> TenantTable::RotateKey(absl::string_view id) {
  absl::MutexLock mutation(&mutation_mu_);
  ASSIGN_OR_RETURN(TenantRecord record, RecordOf(id));
  ASSIGN_OR_RETURN(std::string api_key, NewTenantKey(id));
  record.key_hash = HashCredential(api_key);
  record.key_create_time = NowMicros();
  if (options_.directory != nullptr) RETURN_IF_ERROR(options_.directory->Update(record));
  RETURN_IF_ERROR(store_->Update(record));

  RotatedKey result{std::move(api_key), record.key_create_time};
  absl::MutexLock lock(&mu_);
  tenants_.find(id)->second->record = std::move(record);
  return result;
}

absl::StatusOr<std::shared_ptr<TenantRuntime>> TenantTable::AuthenticateKey(
    absl::string_view key) const {
  return AuthenticateKey(key, HashCredential(key));
}

absl::StatusOr<std::shared_ptr<TenantRuntime>> TenantTable::AuthenticateKey(
    absl::string_view key, const KeyHash& hash) const {
  static constexpr char kRefused[] =
      "invalid tenant API key (expected \"authorization: Bearer tsk_<tenant>.<secret>\")";
  absl::string_view id = TenantIdOfKey(key);
  if (id.empty()) return absl::UnauthenticatedError(kRefused);
  absl::ReaderMutexLock lock(&mu_);
  auto it = tenants_.find(id);
  if (it == tenants_.end() || !HashesEqual(hash, it->second->record.key_hash)) {
    return absl::UnauthenticatedError(kRefused);
  }
  return it->second->runtime;
}

std::vector<DeviceLoad> TenantTable::DeviceLoadsLocked() const {
  std::vector<DeviceLoad> loads;
  for (const DeviceInfo& device : backend_->devices()) loads.push_back(DeviceLoad{device});
  for (const auto& [id, entry] : tenants_) {
    int index = entry->record.device_index;
    if (index < 0 || static_cast<size_t>(index) >= loads.size()) continue;
    loads[index].reserved_bytes += entry->record.quota.device_memory_bytes;
    loads[index].contexts += 1;
    loads[index].share_percent += entry->record.quota.compute_share_percent;
  }
  // Readers only read: several hold mu_ shared at once (Deregister prunes what has drained).
  for (const Draining& d : draining_) {
    if (d.ledger->used() == 0) continue;
    if (d.device >= 0 && static_cast<size_t>(d.device) < loads.size()) {
      loads[d.device].reserved_bytes += d.bytes;
    }
  }
  return loads;
}

std::vector<uint32_t> TenantTable::TenantsPerDevice() const {
  std::vector<uint32_t> tenants;
  for (const DeviceLoad& load : DeviceLoads()) tenants.push_back(load.contexts);
  return tenants;
}

std::vector<DeviceLoad> TenantTable::DeviceLoads() const {
  absl::ReaderMutexLock lock(&mu_);
  return DeviceLoadsLocked();
}

size_t TenantTable::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return tenants_.size();
}

void TenantTable::ReleaseContexts() {
  absl::MutexLock mutation(&mutation_mu_);
  std::map<std::string, std::unique_ptr<Entry>, std::less<>> released;
  {
    absl::MutexLock lock(&mu_);
    released_ = true;
    released.swap(tenants_);
  }
  for (auto& [id, entry] : released)
    entry->runtime->Close("is unavailable: the server is shutting down",
                          absl::StatusCode::kUnavailable);
  if (scheduler_ != nullptr) scheduler_->Stop();
}

}  // namespace tessera
