#ifndef TESSERA_SERVER_SERVICE_METRICS_H_
#define TESSERA_SERVER_SERVICE_METRICS_H_

// The server's Prometheus metrics, kept with prometheus-cpp: the state read at scrape time
// (device and per-tenant gauges and counters from the tenant table) and what happens in
// between (RPCs handled and their latency, jobs' queue wait and run time by tenant and
// kernel, transfer bytes and time, refusals by reason, build info). docs/operations.md
// lists every family.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/backend/backend.h"
#include "server/common/telemetry.h"

namespace tessera {

class TenantTable;

/// How tenants appear in labels (--metrics_tenant_label): their id, a stable hash of it
/// (the first 12 hex digits of SHA-256, so series can be told apart without naming the
/// tenant), or not at all (per-tenant series are summed over tenants).
enum class TenantLabel { kId, kHash, kNone };
absl::StatusOr<TenantLabel> ParseTenantLabel(absl::string_view text);

struct BuildInfo {
  std::string version;
  std::string build_type;
  std::string git_revision;
  std::string cuda_toolkit;  // "" when the CUDA module was not built
};

class Metrics final : public telemetry::Sink {
 public:
  Metrics(const TenantTable* tenants, const Backend* backend, TenantLabel tenant_label,
          BuildInfo build);
  ~Metrics() override;

  /// One finished RPC (the access log interceptor). `method` is "package.Service/Method".
  void RpcHandled(absl::string_view method, absl::string_view code, double seconds);
  /// A completed transfer ("upload" or "download") of `bytes` taking `seconds`.
  void Transfer(absl::string_view tenant, absl::string_view direction, uint64_t bytes,
                double seconds);

  void JobFinished(const telemetry::JobSample& job) override;
  void Refused(absl::string_view reason) override;

  /// The text exposition (format 0.0.4) of every family, state read now.
  std::string Render();

  /// The label value of `tenant` under the configured mode ("" for kNone).
  std::string TenantValue(absl::string_view tenant) const;

 private:
  prometheus::Labels TenantLabels(absl::string_view tenant) const;
  /// Forgets per-tenant series of tenants no longer registered (bounded cardinality).
  void Prune(const absl::flat_hash_set<std::string>& live_values) ABSL_LOCKS_EXCLUDED(mu_);
  /// Observes `value` in the series of `family` for `tenant` and one more label.
  void Observe(prometheus::Family<prometheus::Histogram>& family, absl::string_view tenant,
               absl::string_view label, absl::string_view label_value,
               const prometheus::Histogram::BucketBoundaries& buckets, double value)
      ABSL_LOCKS_EXCLUDED(mu_);

  const TenantTable* const tenants_;
  const Backend* const backend_;
  const TenantLabel tenant_label_;
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& rpc_handled_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Histogram>& job_queue_wait_;
  prometheus::Family<prometheus::Histogram>& job_run_;
  prometheus::Family<prometheus::Histogram>& transfer_bytes_;
  prometheus::Family<prometheus::Histogram>& transfer_seconds_;
  prometheus::Family<prometheus::Counter>& refusals_;
  prometheus::Family<prometheus::Gauge>& build_info_;

  // Per-tenant series made so far, by tenant label value, for Prune; held across Add and
  // Observe so that a series is never removed while observed.
  absl::Mutex mu_;
  using Series =
      std::vector<std::pair<prometheus::Family<prometheus::Histogram>*, prometheus::Histogram*>>;
  std::map<std::string, Series> series_ ABSL_GUARDED_BY(mu_);
  // The series each call and job lands in, found without building label maps (prometheus-cpp
  // hashes them on every Add): per-tenant histograms by family, tenant id and label value
  // (dropped when Prune removes series), RPC series by method and code (never removed).
  absl::flat_hash_map<std::string, prometheus::Histogram*> tenant_series_ ABSL_GUARDED_BY(mu_);
  struct RpcSeries {
    prometheus::Counter* handled;
    prometheus::Histogram* seconds;
  };
  absl::flat_hash_map<std::string, RpcSeries> rpc_series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_METRICS_H_
