#include "server/fleet/fleet.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace tessera::fleet {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

void Set(Struct& s, const std::string& name, const std::string& text) {
  (*s.mutable_fields())[name].set_string_value(text);
}
void SetNumber(Struct& s, const std::string& name, double number) {
  (*s.mutable_fields())[name].set_number_value(number);
}
// 64-bit counts as decimal strings: JSON numbers are doubles.
void SetU64(Struct& s, const std::string& name, uint64_t n) { Set(s, name, absl::StrCat(n)); }
void SetTime(Struct& s, const std::string& name, absl::Time t) {
  Set(s, name, absl::FormatTime(absl::RFC3339_full, t, absl::UTCTimeZone()));
}

std::string ToJson(const Struct& s) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(s, &json);
  return json;
}

absl::StatusOr<Struct> FromJson(absl::string_view json, absl::string_view what) {
  Struct s;
  auto status = google::protobuf::util::JsonStringToMessage(std::string(json), &s);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " in etcd is not JSON: ", status.ToString()));
  }
  return s;
}

// Field readers for a record written by TenantJson/NodeRecordJson; `error` collects the first
// bad field.
struct Reader {
  const Struct& s;
  std::string what;
  absl::Status error;

  const Value* Find(const std::string& name) {
    auto it = s.fields().find(name);
    if (it == s.fields().end()) {
      if (error.ok()) error = absl::InvalidArgumentError(absl::StrCat(what, ": no field ", name));
      return nullptr;
    }
    return &it->second;
  }
  std::string Text(const std::string& name) {
    const Value* v = Find(name);
    return v == nullptr ? "" : v->string_value();
  }
  uint64_t U64(const std::string& name) {
    uint64_t n = 0;
    if (const Value* v = Find(name); v != nullptr && !absl::SimpleAtoi(v->string_value(), &n)) {
      if (error.ok())
        error = absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " is not a count"));
    }
    return n;
  }
  double Number(const std::string& name) {
    const Value* v = Find(name);
    return v == nullptr ? 0 : v->number_value();
  }
  absl::Time Time(const std::string& name) {
    absl::Time t;
    std::string err;
    if (const Value* v = Find(name);
        v != nullptr && !absl::ParseTime(absl::RFC3339_full, v->string_value(), &t, &err)) {
      if (error.ok()) error = absl::InvalidArgumentError(absl::StrCat(what, ": ", name, ": ", err));
    }
    return t;
  }
};

}  // namespace

std::string TenantJson(const TenantRecord& r, absl::string_view home) {
  Struct s;
  Set(s, "id", r.id);
  Set(s, "display_name", r.display_name);
  Struct labels;
  for (const auto& [k, v] : r.labels) Set(labels, k, v);
  *(*s.mutable_fields())["labels"].mutable_struct_value() = labels;
  Struct quota;
  SetU64(quota, "device_memory_bytes", r.quota.device_memory_bytes);
  SetNumber(quota, "compute_share_percent", r.quota.compute_share_percent);
  SetNumber(quota, "max_streams", r.quota.max_streams);
  SetNumber(quota, "max_queued_jobs", r.quota.max_queued_jobs);
  SetNumber(quota, "priority", static_cast<int>(r.quota.priority));
  SetNumber(quota, "max_requests_in_flight", r.quota.max_requests_in_flight);
  SetNumber(quota, "requests_per_second", r.quota.requests_per_second);
  SetU64(quota, "max_region_bytes", r.quota.max_region_bytes);
  *(*s.mutable_fields())["quota"].mutable_struct_value() = quota;
  SetNumber(s, "device_index", r.device_index);
  SetTime(s, "create_time", r.create_time);
  SetTime(s, "update_time", r.update_time);
  SetTime(s, "key_create_time", r.key_create_time);
  Set(s, "key_hash", HexOf(r.key_hash));
  Set(s, "home_node", std::string(home));
  return ToJson(s);
}

absl::StatusOr<TenantRecord> TenantFromJson(absl::string_view json, std::string* home) {
  absl::StatusOr<Struct> s = FromJson(json, "a tenant");
  if (!s.ok()) return s.status();
  Reader in{*s, "a tenant in etcd"};
  TenantRecord r;
  r.id = in.Text("id");
  in.what = absl::StrCat("tenant ", r.id, " in etcd");
  r.display_name = in.Text("display_name");
  if (const Value* labels = in.Find("labels"); labels != nullptr) {
    for (const auto& [k, v] : labels->struct_value().fields()) r.labels[k] = v.string_value();
  }
  if (const Value* q = in.Find("quota"); q != nullptr) {
    Reader quota{q->struct_value(), in.what + ": quota"};
    r.quota.device_memory_bytes = quota.U64("device_memory_bytes");
    r.quota.compute_share_percent = static_cast<uint32_t>(quota.Number("compute_share_percent"));
    r.quota.max_streams = static_cast<uint32_t>(quota.Number("max_streams"));
    r.quota.max_queued_jobs = static_cast<uint32_t>(quota.Number("max_queued_jobs"));
    r.quota.priority =
        static_cast<int>(quota.Number("priority")) == 2 ? Priority::kLow : Priority::kNormal;
    r.quota.max_requests_in_flight = static_cast<uint32_t>(quota.Number("max_requests_in_flight"));
    r.quota.requests_per_second = static_cast<uint32_t>(quota.Number("requests_per_second"));
    r.quota.max_region_bytes = quota.U64("max_region_bytes");
    if (!quota.error.ok()) return quota.error;
  }
  r.device_index = static_cast<int>(in.Number("device_index"));
  r.create_time = in.Time("create_time");
  r.update_time = in.Time("update_time");
  r.key_create_time = in.Time("key_create_time");
  const std::string hex = in.Text("key_hash");
  const bool is_hex = hex.size() == 2 * r.key_hash.size() &&
                      hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
  if (in.error.ok() && !is_hex) {
    in.error = absl::InvalidArgumentError(in.what + ": key_hash is not 32 hex bytes");
  }
  const std::string bytes = is_hex ? absl::HexStringToBytes(hex) : std::string();
  std::copy(bytes.begin(), bytes.end(), r.key_hash.begin());  // empty unless valid
  if (home != nullptr) *home = in.Text("home_node");
  if (!in.error.ok()) return in.error;
  return r;
}

std::string NodeRecordJson(const NodeRecord& node) {
  Struct s;
  Set(s, "name", node.name);
  Set(s, "address", node.address);
  Set(s, "backend", node.backend);
  (*s.mutable_fields())["draining"].set_bool_value(node.draining);
  SetTime(s, "started", node.started);
  auto* devices = (*s.mutable_fields())["devices"].mutable_list_value();
  for (const DeviceCapacity& d : node.devices) {
    Struct device;
    SetNumber(device, "index", d.index);
    Set(device, "name", d.name);
    SetU64(device, "memory_bytes", d.memory_bytes);
    SetU64(device, "free_memory_bytes", d.free_memory_bytes);
    SetNumber(device, "tenants", d.tenants);
    SetNumber(device, "context_limit", d.context_limit);
    *devices->add_values()->mutable_struct_value() = device;
  }
  return ToJson(s);
}

absl::StatusOr<NodeRecord> NodeRecordFromJson(absl::string_view json) {
  absl::StatusOr<Struct> s = FromJson(json, "a node");
  if (!s.ok()) return s.status();
  Reader in{*s, "a node in etcd"};
  NodeRecord node;
  node.name = in.Text("name");
  node.address = in.Text("address");
  node.backend = in.Text("backend");
  if (const Value* d = in.Find("draining"); d != nullptr) node.draining = d->bool_value();
  node.started = in.Time("started");
  if (const Value* list = in.Find("devices"); list != nullptr) {
    for (const Value& v : list->list_value().values()) {
      Reader device{v.struct_value(), "a device of node " + node.name};
      node.devices.push_back(
          DeviceCapacity{.index = static_cast<int>(device.Number("index")),
                         .name = device.Text("name"),
                         .memory_bytes = device.U64("memory_bytes"),
                         .free_memory_bytes = device.U64("free_memory_bytes"),
                         .tenants = static_cast<uint32_t>(device.Number("tenants")),
                         .context_limit = static_cast<uint32_t>(device.Number("context_limit"))});
      if (!device.error.ok()) return device.error;
    }
  }
  if (!in.error.ok()) return in.error;
  return node;
}

Fleet::Fleet(Options options, std::unique_ptr<EtcdClient> etcd,
             std::function<std::vector<DeviceCapacity>()> capacity)
    : options_(std::move(options)),
      etcd_(std::move(etcd)),
      capacity_(std::move(capacity)),
      started_(absl::Now()) {}

absl::StatusOr<std::unique_ptr<Fleet>> Fleet::Join(
    Options options, std::function<std::vector<DeviceCapacity>()> capacity) {
  if (options.node_name.empty() || options.node_name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_name \"", options.node_name, "\": give the node a name without '/'"));
  }
  if (options.advertise_address.empty()) {
    return absl::InvalidArgumentError(
        "--advertise_address: the host:port other nodes and clients "
        "reach this node at is required in fleet mode");
  }
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd =
      EtcdClient::Create({.endpoints = options.etcd_endpoints, .timeout = options.etcd_timeout});
  if (!etcd.ok()) return etcd.status();
  std::unique_ptr<Fleet> fleet(
      new Fleet(std::move(options), *std::move(etcd), std::move(capacity)));
  {
    absl::MutexLock lock(&fleet->mu_);
    if (absl::Status joined = fleet->Register(); !joined.ok()) return joined;
  }
  fleet->renewer_ = std::thread([f = fleet.get()] { f->RenewLoop(); });
  spdlog::info("fleet: node {} ({}) joined through etcd {}", fleet->options_.node_name,
               fleet->options_.advertise_address, fleet->etcd());
  return fleet;
}

Fleet::~Fleet() {
  stop_.Notify();
  if (renewer_.joinable()) renewer_.join();
  absl::MutexLock lock(&mu_);
  if (lease_ != 0) {
    if (absl::Status left = etcd_->RevokeLease(lease_); !left.ok()) {
      spdlog::warn("fleet: leaving: {} (the node's entry goes when its lease expires)",
                   std::string(left.message()));
    }
  }
}

std::string Fleet::TenantKey(absl::string_view id) const {
  return absl::StrCat(options_.prefix, "tenants/", id);
}

std::string Fleet::NodeJson() const {
  return NodeRecordJson(
      NodeRecord{.name = options_.node_name,
                 .address = options_.advertise_address,
                 .backend = options_.backend,
                 .devices = capacity_ ? capacity_() : std::vector<DeviceCapacity>{},
                 .draining = draining_,
                 .started = started_});
}

absl::Status Fleet::Register() {
  absl::StatusOr<int64_t> lease = etcd_->GrantLease(options_.lease_ttl);
  if (!lease.ok()) return lease.status();
  absl::StatusOr<bool> created = etcd_->CreateIfAbsent(NodeKey(), NodeJson(), *lease);
  if (!created.ok() || !*created) {
    (void)etcd_->RevokeLease(*lease);
    if (!created.ok()) return created.status();
    std::string holder;
    if (auto existing = etcd_->Get(NodeKey()); existing.ok() && existing->has_value()) {
      if (auto node = NodeRecordFromJson((*existing)->value); node.ok()) holder = node->address;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "--node_name \"", options_.node_name, "\" is in use by a live node of the fleet (at ",
        holder.empty() ? "an unknown address" : holder,
        "); give each node its own name, or wait for that node's lease (",
        absl::FormatDuration(options_.lease_ttl), ") to expire"));
  }
  lease_ = *lease;
  return absl::OkStatus();
}

void Fleet::RenewLoop() {
  bool warned = false;
  while (!stop_.WaitForNotificationWithTimeout(options_.lease_ttl / 3)) {
    absl::MutexLock lock(&mu_);
    absl::Status status;
    if (lease_ != 0) {
      absl::StatusOr<absl::Duration> renewed = etcd_->KeepAlive(lease_);
      status = renewed.status();
      if (status.ok()) {
        absl::StatusOr<std::optional<KeyValue>> drain =
            etcd_->Get(options_.prefix + "drain/" + options_.node_name);
        if (drain.ok()) draining_ = drain->has_value();
      }
      // The entry carries the node's free capacity: written again on every renewal.
      if (status.ok()) status = etcd_->Put(NodeKey(), NodeJson(), lease_);
      if (absl::IsNotFound(status)) lease_ = 0;  // expired while etcd was away
    }
    if (lease_ == 0) status = Register();
    if (!status.ok() && !warned) {
      spdlog::warn(
          "fleet: node {}: {}; tenants at home keep being served, registrations wait "
          "for etcd",
          options_.node_name, std::string(status.message()));
    } else if (status.ok() && warned) {
      spdlog::info("fleet: node {}: etcd reachable again", options_.node_name);
    }
    warned = !status.ok();
  }
}

absl::StatusOr<std::vector<FleetNode>> Fleet::Nodes() {
  absl::StatusOr<std::vector<KeyValue>> keys = etcd_->GetPrefix(options_.prefix + "nodes/");
  if (!keys.ok()) return keys.status();
  std::vector<NodeRecord> nodes;
  for (const KeyValue& kv : *keys) {
    absl::StatusOr<NodeRecord> node = NodeRecordFromJson(kv.value);
    if (!node.ok()) {
      spdlog::warn("fleet: skipping {}: {}", kv.key, std::string(node.status().message()));
      continue;
    }
    nodes.push_back(*std::move(node));
  }
  return nodes;
}

absl::Status Fleet::Create(const TenantRecord& record) {
  absl::StatusOr<bool> created =
      etcd_->CreateIfAbsent(TenantKey(record.id), TenantJson(record, options_.node_name));
  if (!created.ok()) return created.status();
  if (!*created) {
    return absl::AlreadyExistsError(
        absl::StrCat("tenant_id \"", record.id, "\" is taken (by a node of the fleet)"));
  }
  return absl::OkStatus();
}

absl::Status Fleet::Update(const TenantRecord& record) {
  absl::StatusOr<std::optional<KeyValue>> current = etcd_->Get(TenantKey(record.id));
  if (!current.ok()) return current.status();
  if (!current->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tenant \"", record.id, "\" is no longer in the fleet's directory (etcd)"));
  }
  std::string home;
  if (auto stored = TenantFromJson((*current)->value, &home);
      stored.ok() && home != options_.node_name) {
    return absl::FailedPreconditionError(
        absl::StrCat("tenant \"", record.id, "\" is homed at node ", home, ", not here"));
  }
  absl::StatusOr<bool> replaced = etcd_->ReplaceIfUnchanged(
      TenantKey(record.id), TenantJson(record, options_.node_name), (*current)->mod_revision);
  if (!replaced.ok()) return replaced.status();
  if (!*replaced) {
    return absl::AbortedError(
        absl::StrCat("tenant \"", record.id, "\" changed in etcd meanwhile; retry"));
  }
  return absl::OkStatus();
}

absl::Status Fleet::Remove(absl::string_view id) {
  absl::StatusOr<std::optional<KeyValue>> current = etcd_->Get(TenantKey(id));
  if (!current.ok()) return current.status();
  if (!current->has_value()) return absl::OkStatus();
  absl::StatusOr<bool> deleted = etcd_->DeleteIfUnchanged(TenantKey(id), (*current)->mod_revision);
  if (!deleted.ok()) return deleted.status();
  if (!*deleted) {
    return absl::AbortedError(absl::StrCat("tenant \"", id, "\" changed in etcd meanwhile; retry"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::fleet

namespace tessera::fleet {

absl::Status Fleet::SetDraining(absl::string_view name, bool draining) {
  absl::StatusOr<std::optional<KeyValue>> node =
      etcd_->Get(options_.prefix + "nodes/" + std::string(name));
  if (!node.ok()) return node.status();
  if (!node->has_value()) {
    return absl::NotFoundError(absl::StrCat("no live node named \"", name, "\" in the fleet"));
  }
  const std::string key = options_.prefix + "drain/" + std::string(name);
  if (draining) return etcd_->Put(key, absl::FormatTime(absl::Now()));
  absl::StatusOr<std::optional<KeyValue>> mark = etcd_->Get(key);
  if (!mark.ok()) return mark.status();
  if (!mark->has_value()) return absl::OkStatus();
  absl::StatusOr<bool> deleted = etcd_->DeleteIfUnchanged(key, (*mark)->mod_revision);
  return deleted.ok() ? absl::OkStatus() : deleted.status();
}

void Fleet::CapacityChanged() {
  absl::MutexLock lock(&mu_);
  if (lease_ == 0) return;  // the renewer registers again, with the capacity then
  if (absl::Status put = etcd_->Put(NodeKey(), NodeJson(), lease_); !put.ok()) {
    spdlog::warn("fleet: publishing node {}'s capacity: {}", options_.node_name,
                 std::string(put.message()));
  }
}

absl::StatusOr<std::optional<TenantHome>> Fleet::FindTenant(absl::string_view id) {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&cache_mu_);
    auto it = homes_.find(id);
    if (it != homes_.end() && it->second.expires > now) return it->second.home;
  }
  std::optional<TenantHome> home;
  absl::StatusOr<std::optional<KeyValue>> tenant = etcd_->Get(TenantKey(id));
  if (!tenant.ok()) return tenant.status();
  if (tenant->has_value()) {
    std::string node;
    absl::StatusOr<TenantRecord> record = TenantFromJson((*tenant)->value, &node);
    if (!record.ok()) return record.status();
    home = TenantHome{.key_hash = record->key_hash, .node = node};
    absl::StatusOr<std::optional<KeyValue>> entry = etcd_->Get(options_.prefix + "nodes/" + node);
    if (!entry.ok()) return entry.status();
    if (entry->has_value()) {
      if (absl::StatusOr<NodeRecord> n = NodeRecordFromJson((*entry)->value); n.ok()) {
        home->address = n->address;
      }
    }
  }
  absl::MutexLock lock(&cache_mu_);
  if (homes_.size() >= 4096) homes_.clear();
  homes_[std::string(id)] = CachedHome{home, now + kHomeCacheTtl};
  return home;
}

}  // namespace tessera::fleet
