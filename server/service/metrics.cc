#include "server/service/metrics.h"

#include <algorithm>

#include <openssl/sha.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"

#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/core/admission.h"
#include "server/core/tenant_runtime.h"
#include "server/core/tenant_table.h"

namespace tessera {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr absl::string_view kUnknownMethod = "unknown";

// A method of a service compiled into this server ("package.Service/Method"), whose
// descriptor is in the generated pool (Compute, TenantAdmin, health, reflection).
bool IsServedMethod(absl::string_view method) {
  std::string name(method);
  std::replace(name.begin(), name.end(), '/', '.');
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name) != nullptr;
}

const prometheus::Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
      0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    300};
  return *buckets;
}

const prometheus::Histogram::BucketBoundaries& ByteBuckets() {
  static const auto* buckets = [] {
    auto* b = new prometheus::Histogram::BucketBoundaries;
    for (double v = 4096; v <= 4.0 * (1ull << 30); v *= 4) b->push_back(v);  // 4 KiB..4 GiB
    return b;
  }();
  return *buckets;
}

template <typename T>
prometheus::Family<T>& Build(prometheus::Registry& registry, const std::string& name,
                             const std::string& help) {
  return prometheus::detail::Builder<T>().Name(name).Help(help).Register(registry);
}

// A gauge or counter family read from the current state.
struct StateFamily {
  MetricFamily family;
  void Add(std::vector<ClientMetric::Label> labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    (family.type == MetricType::Counter ? m.counter.value : m.gauge.value) = value;
    family.metric.push_back(std::move(m));
  }
};

StateFamily NewFamily(std::string name, MetricType type, std::string help) {
  return StateFamily{MetricFamily{std::move(name), std::move(help), type, {}}};
}

}  // namespace

absl::StatusOr<TenantLabel> ParseTenantLabel(absl::string_view text) {
  if (text == "id") return TenantLabel::kId;
  if (text == "hash") return TenantLabel::kHash;
  if (text == "none") return TenantLabel::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("--metrics_tenant_label=", text, ": allowed values are id, hash, none"));
}

Metrics::Metrics(const TenantTable* tenants, const Backend* backend, TenantLabel tenant_label,
                 BuildInfo build)
    : tenants_(tenants),
      backend_(backend),
      tenant_label_(tenant_label),
      registry_(std::make_shared<prometheus::Registry>()),
      rpc_handled_(Build<prometheus::Counter>(*registry_, "grpc_server_handled_total",
                                              "RPCs completed on the server, by method and "
                                              "status code.")),
      rpc_seconds_(Build<prometheus::Histogram>(
          *registry_, "grpc_server_handling_seconds",
          "Time from receiving an RPC's metadata to sending its status, by method.")),
      job_queue_wait_(Build<prometheus::Histogram>(
          *registry_, "tessera_job_queue_wait_seconds",
          "Time jobs waited from acceptance to release to the device (or to their drop), by "
          "tenant and kernel (\"program\" for several steps).")),
      job_run_(Build<prometheus::Histogram>(
          *registry_, "tessera_job_run_seconds",
          "Time jobs ran on the device, by tenant and kernel (\"program\" for several steps).")),
      transfer_bytes_(Build<prometheus::Histogram>(
          *registry_, "tessera_transfer_bytes",
          "Bytes moved by completed tensor transfers (upload: CreateTensor and WriteTensor; "
          "download: ReadTensor), by tenant and direction.")),
      transfer_seconds_(Build<prometheus::Histogram>(
          *registry_, "tessera_transfer_seconds",
          "Duration of completed tensor transfers, by tenant and direction.")),
      refusals_(Build<prometheus::Counter>(
          *registry_, "tessera_admission_refusals_total",
          "Requests refused with RESOURCE_EXHAUSTED, by reason (device_memory, "
          "device_contexts, tenant_memory, queue_depth, kernel_count, requests_in_flight, "
          "request_rate, transfer_queue, other).")),
      build_info_(
          Build<prometheus::Gauge>(*registry_, "tessera_build_info",
                                   "Always 1; the labels describe the running server's build.")) {
  build_info_
      .Add({{"version", build.version},
            {"build_type", build.build_type},
            {"git_revision", build.git_revision},
            {"cuda_toolkit", build.cuda_toolkit}})
      .Set(1);
  // The refusal reasons exist from the start, so that rate() sees the first one.
  for (const char* reason :
       {"device_memory", "device_contexts", "tenant_memory", "queue_depth", "kernel_count",
        "requests_in_flight", "request_rate", "transfer_queue"}) {
    refusals_.Add({{"reason", reason}});
  }
}

Metrics::~Metrics() = default;

std::string Metrics::TenantValue(absl::string_view tenant) const {
  switch (tenant_label_) {
    case TenantLabel::kId:
      return std::string(tenant);
    case TenantLabel::kHash: {
      unsigned char digest[SHA256_DIGEST_LENGTH];
      SHA256(reinterpret_cast<const unsigned char*>(tenant.data()), tenant.size(), digest);
      return absl::BytesToHexString(
                 absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)))
          .substr(0, 12);
    }
    case TenantLabel::kNone:
      break;
  }
  return "";
}

prometheus::Labels Metrics::TenantLabels(absl::string_view tenant) const {
  if (tenant_label_ == TenantLabel::kNone) return {};
  return {{"tenant", TenantValue(tenant)}};
}

void Metrics::Observe(prometheus::Family<prometheus::Histogram>& family, absl::string_view tenant,
                      absl::string_view label, absl::string_view label_value,
                      const prometheus::Histogram::BucketBoundaries& buckets, double value) {
  // Without a tenant label every tenant shares one series, and one entry (Prune never runs
  // then, so keying by tenant would keep every tenant that ever called).
  const absl::string_view who = tenant_label_ == TenantLabel::kNone ? "" : tenant;
  const std::string key =
      absl::StrCat(reinterpret_cast<uintptr_t>(&family), "/", who.size(), "/", who, label_value);
  absl::MutexLock lock(&mu_);
  auto cached = tenant_series_.find(key);
  if (cached != tenant_series_.end()) {
    cached->second->Observe(value);
    return;
  }
  prometheus::Labels all = TenantLabels(tenant);
  all.emplace(std::string(label), std::string(label_value));
  prometheus::Histogram& h = family.Add(all, buckets);
  h.Observe(value);
  tenant_series_.emplace(key, &h);
  if (tenant_label_ == TenantLabel::kNone) return;
  Series& series = series_[all["tenant"]];
  if (std::find(series.begin(), series.end(), std::make_pair(&family, &h)) == series.end()) {
    series.emplace_back(&family, &h);
  }
}

void Metrics::RpcHandled(absl::string_view method, absl::string_view code, double seconds) {
  std::string key = absl::StrCat(method, " ", code);
  absl::MutexLock lock(&mu_);
  auto it = rpc_series_.find(key);
  if (it == rpc_series_.end() && !IsServedMethod(method)) {
    // A name the client made up (gRPC answered UNIMPLEMENTED): one "unknown" series, so that
    // unauthenticated calls to invented methods cannot grow the families or this map.
    method = kUnknownMethod;
    key = absl::StrCat(method, " ", code);
    it = rpc_series_.find(key);
  }
  if (it == rpc_series_.end()) {
    RpcSeries series{
        &rpc_handled_.Add({{"method", std::string(method)}, {"code", std::string(code)}}),
        &rpc_seconds_.Add({{"method", std::string(method)}}, SecondsBuckets())};
    it = rpc_series_.emplace(key, series).first;
  }
  it->second.handled->Increment();
  it->second.seconds->Observe(seconds);
}

void Metrics::Transfer(absl::string_view tenant, absl::string_view direction, uint64_t bytes,
                       double seconds) {
  Observe(transfer_bytes_, tenant, "direction", direction, ByteBuckets(),
          static_cast<double>(bytes));
  Observe(transfer_seconds_, tenant, "direction", direction, SecondsBuckets(), seconds);
}

void Metrics::JobFinished(const telemetry::JobSample& job) {
  Observe(job_queue_wait_, job.tenant, "kernel", job.kernel, SecondsBuckets(),
          absl::ToDoubleSeconds(job.queue_wait));
  if (job.ran) {
    Observe(job_run_, job.tenant, "kernel", job.kernel, SecondsBuckets(),
            absl::ToDoubleSeconds(job.run_time));
  }
}

void Metrics::Refused(absl::string_view reason) {
  refusals_.Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::Prune(const absl::flat_hash_set<std::string>& live_values) {
  absl::MutexLock lock(&mu_);
  const size_t before = series_.size();
  for (auto it = series_.begin(); it != series_.end();) {
    if (live_values.contains(it->first)) {
      ++it;
      continue;
    }
    for (auto& [family, histogram] : it->second) family->Remove(histogram);
    it = series_.erase(it);
  }
  // The cache held removed series; the live ones are found again.
  if (series_.size() != before) tenant_series_.clear();
}

std::string Metrics::Render() {
  std::vector<MetricFamily> families;
  const std::vector<DeviceLoad> loads = tenants_->DeviceLoads();
  auto device = [&](const char* name, const char* help, auto value) {
    StateFamily f = NewFamily(name, MetricType::Gauge, help);
    for (const DeviceLoad& l : loads) {
      f.Add({{"device", absl::StrCat(l.device.index)}}, static_cast<double>(value(l)));
    }
    families.push_back(std::move(f.family));
  };
  device("tessera_device_memory_bytes", "Device memory capacity.",
         [](const DeviceLoad& l) { return l.device.memory_bytes; });
  device("tessera_device_reserved_bytes", "Memory quotas of tenants on the device.",
         [](const DeviceLoad& l) { return l.reserved_bytes; });
  device("tessera_device_tenants", "Tenants (contexts) placed on the device.",
         [](const DeviceLoad& l) { return l.contexts; });
  StateFamily mps = NewFamily("tessera_mps_enabled", MetricType::Gauge,
                              "1 when tenant contexts are MPS clients.");
  mps.Add({}, backend_->mps().decision == MpsDecision::kMps ? 1 : 0);
  families.push_back(std::move(mps.family));

  struct Row {
    std::string value;  // the tenant label value
    UsageInfo usage;
  };
  std::vector<Row> rows;
  absl::flat_hash_set<std::string> live;
  std::string after;
  for (;;) {
    TenantTable::Page page = tenants_->List(after, 256);
    for (const TenantView& t : page.tenants) {
      absl::StatusOr<std::shared_ptr<TenantRuntime>> rt = tenants_->RuntimeOf(t.record.id);
      if (!rt.ok()) continue;
      rows.push_back({TenantValue(t.record.id), (*rt)->Usage()});
      live.insert(rows.back().value);
    }
    if (page.last_id.empty()) break;
    after = page.last_id;
  }
  auto per_tenant = [&](const char* name, MetricType type, const char* help, auto value) {
    StateFamily f = NewFamily(name, type, help);
    if (tenant_label_ == TenantLabel::kNone) {
      double sum = 0;
      for (const Row& r : rows) sum += static_cast<double>(value(r.usage));
      f.Add({}, sum);
    } else {
      for (const Row& r : rows) f.Add({{"tenant", r.value}}, static_cast<double>(value(r.usage)));
    }
    families.push_back(std::move(f.family));
  };
  per_tenant("tessera_tenant_memory_used_bytes", MetricType::Gauge,
             "Bytes the tenant's work holds against its quota (tensors, job scratch, transfer "
             "staging).",
             [](const UsageInfo& u) { return u.memory_used_bytes; });
  per_tenant("tessera_tenant_memory_tensor_bytes", MetricType::Gauge,
             "Bytes of the tenant's tensors (and uncommitted uploads).",
             [](const UsageInfo& u) { return u.memory_tensor_bytes; });
  per_tenant("tessera_tenant_memory_scratch_bytes", MetricType::Gauge,
             "Bytes reserved by the tenant's running jobs besides their outputs.",
             [](const UsageInfo& u) { return u.memory_scratch_bytes; });
  per_tenant("tessera_tenant_memory_staging_bytes", MetricType::Gauge,
             "Bytes of the tenant's transfer chunks held in host memory.",
             [](const UsageInfo& u) { return u.memory_staging_bytes; });
  per_tenant("tessera_tenant_memory_quota_bytes", MetricType::Gauge, "The tenant's memory quota.",
             [](const UsageInfo& u) { return u.memory_quota_bytes; });
  per_tenant("tessera_tenant_tensors", MetricType::Gauge, "Tensors the tenant holds.",
             [](const UsageInfo& u) { return u.tensors; });
  per_tenant("tessera_tenant_regions", MetricType::Gauge,
             "Shared-memory regions the tenant has mapped in the server.",
             [](const UsageInfo& u) { return u.regions; });
  per_tenant("tessera_tenant_region_bytes", MetricType::Gauge,
             "Bytes of the tenant's shared-memory regions (against quota.max_region_bytes).",
             [](const UsageInfo& u) { return u.region_bytes; });
  per_tenant("tessera_tenant_region_quota_bytes", MetricType::Gauge,
             "The tenant's quota.max_region_bytes.",
             [](const UsageInfo& u) { return u.region_quota_bytes; });
  per_tenant("tessera_tenant_jobs_queued", MetricType::Gauge, "Jobs waiting.",
             [](const UsageInfo& u) { return u.jobs_queued; });
  per_tenant("tessera_tenant_jobs_running", MetricType::Gauge, "Jobs running.",
             [](const UsageInfo& u) { return u.jobs_running; });
  per_tenant("tessera_tenant_jobs_succeeded_total", MetricType::Counter, "Jobs that succeeded.",
             [](const UsageInfo& u) { return u.jobs_succeeded; });
  per_tenant("tessera_tenant_jobs_failed_total", MetricType::Counter, "Jobs that failed.",
             [](const UsageInfo& u) { return u.jobs_failed; });
  per_tenant("tessera_tenant_jobs_cancelled_total", MetricType::Counter,
             "Jobs cancelled while queued (expired ones included).",
             [](const UsageInfo& u) { return u.jobs_cancelled; });
  per_tenant("tessera_tenant_jobs_expired_total", MetricType::Counter,
             "Jobs whose deadline passed while they were queued.",
             [](const UsageInfo& u) { return u.jobs_expired; });
  per_tenant("tessera_tenant_busy_seconds_total", MetricType::Counter,
             "Time the tenant's work spent executing.",
             [](const UsageInfo& u) { return absl::ToDoubleSeconds(u.busy_time); });

  if (tenant_label_ != TenantLabel::kNone) Prune(live);
  for (MetricFamily& f : registry_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace tessera
