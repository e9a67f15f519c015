#include "server/fleet/fleet.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

#include "server/common/status_macros.h"

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

std::string TenantJson(const TenantRecord& r, absl::string_view home,
                       absl::string_view moved_from) {
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
  if (!moved_from.empty()) {
    Set(s, "moved_from", std::string(moved_from));
    SetTime(s, "moved_time", r.update_time);
  }
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
    SetNumber(device, "share_percent", d.share_percent);
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
                         .share_percent = static_cast<uint32_t>(device.Number("share_percent")),
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
  // A node that was never in this fleet may bring tenants of its own (a single server's state
  // directory): Attach publishes them. A node that was may not: those it still has and the
  // directory lacks were deregistered while it was away.
  absl::StatusOr<bool> first = fleet->etcd_->CreateIfAbsent(
      fleet->options_.prefix + "known/" + fleet->options_.node_name,
      absl::FormatTime(absl::RFC3339_full, absl::Now(), absl::UTCTimeZone()));
  if (!first.ok()) return first.status();
  fleet->first_join_ = *first;
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
    // Stopped on purpose (an upgrade, a reboot): its tenants wait for it rather than move.
    if (absl::Status away =
            etcd_->Put(options_.prefix + "away/" + options_.node_name,
                       absl::FormatTime(absl::RFC3339_full, absl::Now(), absl::UTCTimeZone()));
        !away.ok()) {
      spdlog::warn("fleet: marking node {} away: {}", options_.node_name,
                   std::string(away.message()));
    }
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
  // Back: no longer away.
  const std::string away = options_.prefix + "away/" + options_.node_name;
  if (auto mark = etcd_->Get(away); mark.ok() && mark->has_value()) {
    (void)etcd_->DeleteIfUnchanged(away, (*mark)->mod_revision);
  }
  return absl::OkStatus();
}

absl::Duration Fleet::Grace() const {
  return std::clamp(options_.lease_ttl / 4, absl::Seconds(1), absl::Seconds(5));
}

absl::Status Fleet::Attach(Members* members) {
  absl::MutexLock lock(&members_mu_);
  members_ = members;
  if (members == nullptr) return absl::OkStatus();
  return ReconcileLocked(/*attaching=*/true);
}

absl::Status Fleet::ReconcileLocked(bool attaching) {
  // The local ids are read before the directory: a tenant registered meanwhile is in the
  // directory before it is local (TenantTable::Register), so none looks deregistered.
  const std::vector<std::string> local = members_->LocalTenantIds();
  std::vector<KeyValue> node_keys, tenant_keys, drain_keys, away_keys;
  absl::Status read = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(node_keys, etcd_->GetPrefix(options_.prefix + "nodes/"));
    ASSIGN_OR_RETURN(tenant_keys, etcd_->GetPrefix(options_.prefix + "tenants/"));
    ASSIGN_OR_RETURN(drain_keys, etcd_->GetPrefix(options_.prefix + "drain/"));
    ASSIGN_OR_RETURN(away_keys, etcd_->GetPrefix(options_.prefix + "away/"));
    return absl::OkStatus();
  }();
  const absl::Time now = absl::Now();
  if (!read.ok()) {
    etcd_lost_ = true;
    return read;
  }
  if (etcd_lost_) {
    // Back after an outage, during which every node's lease may have expired: nodes get a
    // grace from now to join again before any of their tenants moves.
    etcd_lost_ = false;
    settled_since_ = now;
    gone_since_.clear();
  }
  auto name_after = [](const std::string& key, const std::string& folder) {
    return key.substr(key.find(folder) + folder.size());
  };
  std::vector<NodeRecord> live;
  for (const KeyValue& kv : node_keys) {
    if (auto node = NodeRecordFromJson(kv.value); node.ok()) live.push_back(*std::move(node));
  }
  auto is_live = [&](const std::string& name) {
    return std::any_of(live.begin(), live.end(),
                       [&](const NodeRecord& n) { return n.name == name; });
  };
  std::set<std::string> moving, away;
  for (const KeyValue& kv : drain_keys) {
    if (kv.value == "move") moving.insert(name_after(kv.key, "drain/"));
  }
  for (const KeyValue& kv : away_keys) away.insert(name_after(kv.key, "away/"));
  struct Listed {
    TenantRecord record;
    std::string home;
    int64_t revision = 0;
  };
  std::map<std::string, Listed> tenants;
  for (const KeyValue& kv : tenant_keys) {
    Listed t{.revision = kv.mod_revision};
    absl::StatusOr<TenantRecord> record = TenantFromJson(kv.value, &t.home);
    if (!record.ok()) {
      spdlog::warn("fleet: skipping {}: {}", kv.key, std::string(record.status().message()));
      continue;
    }
    t.record = *std::move(record);
    tenants.emplace(t.record.id, std::move(t));
  }
  const std::string& self = options_.node_name;
  bool changed = false;
  // 1. This node's tenants that the directory homes elsewhere now, or no longer has.
  for (const std::string& id : local) {
    auto it = tenants.find(id);
    if (it == tenants.end()) {
      if (attaching && first_join_) {
        absl::StatusOr<TenantRecord> record = members_->LocalRecord(id);
        if (!record.ok()) continue;
        absl::StatusOr<bool> created =
            etcd_->CreateIfAbsent(TenantKey(id), TenantJson(*record, self));
        if (!created.ok()) return created.status();
        if (*created) {
          spdlog::info("fleet: tenant {} of this node's state published to the fleet", id);
          continue;
        }
        members_->Forget(id, "is registered at another node of the fleet with the same id");
      } else {
        members_->Forget(id, "was deregistered from the fleet while this node was away");
      }
      changed = true;
    } else if (it->second.home != self) {
      members_->Forget(id, absl::StrCat("moved to node ", it->second.home,
                                        " (its home was lost or drained); connect there"));
      changed = true;
    }
  }
  // 2. Tenants homed here that are not here (adopted but not stored; a lost state file):
  // taken on again, empty.
  const std::set<std::string> here(local.begin(), local.end());
  for (const auto& [id, t] : tenants) {
    if (t.home != self || here.contains(id)) continue;
    absl::Status adopted = members_->Adopt(
        t.record,
        "; this node restarted without the tenant's state: its tensors and jobs from before "
        "are gone",
        [](const TenantRecord&) { return absl::OkStatus(); });
    if (adopted.ok()) {
      changed = true;
      spdlog::warn("fleet: tenant {} is homed here but was not in the local state; served again",
                   id);
    }
  }
  // 3. Tenants of nodes lost (gone past the grace, not away on purpose) or drained with --move.
  for (auto it = gone_since_.begin(); it != gone_since_.end();) {
    it = is_live(it->first) ? gone_since_.erase(it) : std::next(it);
  }
  const bool settled = now - std::max(started_, settled_since_) >= Grace();
  for (const auto& [id, t] : tenants) {
    if (t.home == self) continue;
    bool orphan = moving.contains(t.home);
    if (!orphan && !is_live(t.home)) {
      const absl::Time gone = gone_since_.try_emplace(t.home, now).first->second;
      orphan = now - gone >= Grace() && !away.contains(t.home) && settled;
    }
    if (!orphan) {
      orphan_since_.erase(id);
      continue;
    }
    const absl::Time since = orphan_since_.try_emplace(id, now).first->second;
    std::vector<FleetNode> candidates;
    for (const NodeRecord& n : live) {
      if (n.name != t.home) candidates.push_back(n);
    }
    const std::optional<size_t> chosen =
        ChooseNode(candidates, t.record.quota.device_memory_bytes,
                   t.record.quota.compute_share_percent, options_.placement);
    // The node placement picks adopts; if it has not after three grace periods (its view of
    // the capacities differed), any node with room does. The transaction keeps it to one.
    if (!chosen.has_value() || (candidates[*chosen].name != self && now - since < 3 * Grace())) {
      continue;
    }
    const std::string from = t.home;
    const int64_t revision = t.revision;
    const std::string note =
        absl::StrCat("; tenant \"", id, "\" moved to node ", self, " at ",
                     absl::FormatTime(absl::RFC3339_sec, now, absl::UTCTimeZone()),
                     " when its node ", from, moving.contains(from) ? " was drained" : " was lost",
                     ": its tensors, jobs and defined kernels from before the move are gone");
    absl::Status adopted =
        members_->Adopt(t.record, note, [&](const TenantRecord& record) -> absl::Status {
          ASSIGN_OR_RETURN(bool claimed,
                           etcd_->ReplaceIfUnchanged(TenantKey(record.id),
                                                     TenantJson(record, self, from), revision));
          if (!claimed) {
            return absl::AbortedError(
                absl::StrCat("tenant \"", record.id, "\" was taken by another node first"));
          }
          return absl::OkStatus();
        });
    if (adopted.ok()) {
      spdlog::warn("fleet: tenant {} moved here from node {} ({})", id, from,
                   moving.contains(from) ? "drained" : "lost");
      orphan_since_.erase(id);
      changed = true;
      absl::MutexLock lock(&cache_mu_);
      homes_.erase(id);
    } else if (!absl::IsAborted(adopted)) {
      spdlog::warn("fleet: adopting tenant {} from node {}: {}", id, from,
                   std::string(adopted.message()));
    }
  }
  if (changed) CapacityChanged();
  return absl::OkStatus();
}

void Fleet::RenewLoop() {
  bool warned = false;
  const absl::Duration renew_every = options_.lease_ttl / 3;
  const absl::Duration scan_every = std::min(renew_every, absl::Seconds(1));
  absl::Time last_renewal = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(scan_every)) {
    {
      absl::MutexLock lock(&members_mu_);
      if (members_ != nullptr) {
        if (absl::Status reconciled = ReconcileLocked(false); !reconciled.ok() && !warned) {
          spdlog::warn("fleet: node {}: {}", options_.node_name, std::string(reconciled.message()));
        }
      }
    }
    // While etcd is away, renewal is retried at every scan, so that the node joins again
    // within a scan of etcd's return, before the others' grace runs out.
    if (!warned && absl::Now() - last_renewal < renew_every) continue;
    last_renewal = absl::Now();
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

absl::Status Fleet::SetDraining(absl::string_view name, bool draining, bool move) {
  absl::StatusOr<std::optional<KeyValue>> node =
      etcd_->Get(options_.prefix + "nodes/" + std::string(name));
  if (!node.ok()) return node.status();
  if (!node->has_value()) {
    // A node that is stopped may still have tenants to move elsewhere.
    absl::StatusOr<std::optional<KeyValue>> known =
        etcd_->Get(options_.prefix + "known/" + std::string(name));
    if (!known.ok()) return known.status();
    if (!known->has_value()) {
      return absl::NotFoundError(absl::StrCat("no node named \"", name, "\" in the fleet"));
    }
    if (draining && !move) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node \"", name,
          "\" is not live, so it takes no new tenants anyway; drain it with --move (move_tenants) "
          "to move its tenants to other nodes"));
    }
  }
  const std::string key = options_.prefix + "drain/" + std::string(name);
  if (draining) return etcd_->Put(key, move ? "move" : absl::FormatTime(absl::Now()));
  absl::StatusOr<std::optional<KeyValue>> mark = etcd_->Get(key);
  if (!mark.ok()) return mark.status();
  if (!mark->has_value()) return absl::OkStatus();
  absl::StatusOr<bool> deleted = etcd_->DeleteIfUnchanged(key, (*mark)->mod_revision);
  return deleted.ok() ? absl::OkStatus() : deleted.status();
}

absl::StatusOr<std::vector<FleetTenant>> Fleet::Tenants() {
  ASSIGN_OR_RETURN(std::vector<KeyValue> keys, etcd_->GetPrefix(options_.prefix + "tenants/"));
  std::vector<FleetTenant> tenants;
  for (const KeyValue& kv : keys) {
    FleetTenant t;
    absl::StatusOr<TenantRecord> record = TenantFromJson(kv.value, &t.home_node);
    if (!record.ok()) {
      spdlog::warn("fleet: skipping {}: {}", kv.key, std::string(record.status().message()));
      continue;
    }
    t.record = *std::move(record);
    tenants.push_back(std::move(t));
  }
  return tenants;
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
  // A home that is not live is not cached: its tenants are about to move.
  if (home.has_value() && home->address.empty()) return home;
  absl::MutexLock lock(&cache_mu_);
  if (homes_.size() >= 4096) homes_.clear();
  homes_[std::string(id)] = CachedHome{home, now + kHomeCacheTtl};
  return home;
}

}  // namespace tessera::fleet
