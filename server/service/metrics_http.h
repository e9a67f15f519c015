#ifndef TESSERA_SERVER_SERVICE_METRICS_HTTP_H_
#define TESSERA_SERVER_SERVICE_METRICS_HTTP_H_

// --metrics_listen: Prometheus text exposition (version 0.0.4) at GET /metrics over plain
// HTTP/1.0 — per device (memory, reservations, tenants) and per tenant (memory, tensors, jobs,
// busy time). One thread; each request is bounded in size and time.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

#include "server/backend/backend.h"
#include "server/core/tenant_table.h"

namespace tessera {

/// The exposition text for the current state.
std::string RenderMetrics(const TenantTable& tenants, const Backend& backend);

class MetricsServer {
 public:
  /// Listens on `address` ("host:port"; port 0 picks one). INVALID_ARGUMENT for a malformed
  /// address, UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              const TenantTable* tenants,
                                                              const Backend* backend);
  ~MetricsServer();
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  void Serve();

  int fd_ = -1;
  int port_ = 0;
  const TenantTable* tenants_ = nullptr;
  const Backend* backend_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_METRICS_HTTP_H_
