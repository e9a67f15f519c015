#include "server/service/metrics_http.h"

#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "server/core/admission.h"
#include "server/core/tenant_runtime.h"

namespace tessera {
namespace {

void Family(std::string& out, const char* name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

std::string RenderMetrics(const TenantTable& tenants, const Backend& backend) {
  std::string out;
  const std::vector<DeviceLoad> loads = tenants.DeviceLoads();
  Family(out, "tessera_device_memory_bytes", "gauge", "Device memory capacity.");
  for (const DeviceLoad& l : loads) {
    absl::StrAppend(&out, "tessera_device_memory_bytes{device=\"", l.device.index, "\"} ",
                    l.device.memory_bytes, "\n");
  }
  Family(out, "tessera_device_reserved_bytes", "gauge", "Memory quotas of tenants on the device.");
  for (const DeviceLoad& l : loads) {
    absl::StrAppend(&out, "tessera_device_reserved_bytes{device=\"", l.device.index, "\"} ",
                    l.reserved_bytes, "\n");
  }
  Family(out, "tessera_device_tenants", "gauge", "Tenants (contexts) placed on the device.");
  for (const DeviceLoad& l : loads) {
    absl::StrAppend(&out, "tessera_device_tenants{device=\"", l.device.index, "\"} ", l.contexts,
                    "\n");
  }
  Family(out, "tessera_mps_enabled", "gauge", "1 when tenant contexts are MPS clients.");
  absl::StrAppend(&out, "tessera_mps_enabled ", backend.mps().decision == MpsDecision::kMps ? 1 : 0,
                  "\n");

  struct Row {
    std::string id;
    UsageInfo usage;
  };
  std::vector<Row> rows;
  std::string after;
  for (;;) {
    TenantTable::Page page = tenants.List(after, 256);
    for (const TenantView& t : page.tenants) {
      absl::StatusOr<std::shared_ptr<TenantRuntime>> rt = tenants.RuntimeOf(t.record.id);
      if (rt.ok()) rows.push_back({t.record.id, (*rt)->Usage()});
    }
    if (page.last_id.empty()) break;
    after = page.last_id;
  }
  auto per_tenant = [&](const char* name, const char* type, const char* help, auto value) {
    Family(out, name, type, help);
    for (const Row& r : rows) {
      absl::StrAppend(&out, name, "{tenant=\"", r.id, "\"} ", value(r.usage), "\n");
    }
  };
  per_tenant("tessera_tenant_memory_used_bytes", "gauge",
             "Bytes the tenant's work holds against its quota (tensors, job scratch, transfer "
             "staging).",
             [](const UsageInfo& u) { return u.memory_used_bytes; });
  per_tenant("tessera_tenant_memory_tensor_bytes", "gauge",
             "Bytes of the tenant's tensors (and uncommitted uploads).",
             [](const UsageInfo& u) { return u.memory_tensor_bytes; });
  per_tenant("tessera_tenant_memory_scratch_bytes", "gauge",
             "Bytes reserved by the tenant's running jobs besides their outputs.",
             [](const UsageInfo& u) { return u.memory_scratch_bytes; });
  per_tenant("tessera_tenant_memory_staging_bytes", "gauge",
             "Bytes of the tenant's transfer chunks held in host memory.",
             [](const UsageInfo& u) { return u.memory_staging_bytes; });
  per_tenant("tessera_tenant_memory_quota_bytes", "gauge", "The tenant's memory quota.",
             [](const UsageInfo& u) { return u.memory_quota_bytes; });
  per_tenant("tessera_tenant_tensors", "gauge", "Tensors the tenant holds.",
             [](const UsageInfo& u) { return u.tensors; });
  per_tenant("tessera_tenant_jobs_queued", "gauge", "Jobs waiting.",
             [](const UsageInfo& u) { return u.jobs_queued; });
  per_tenant("tessera_tenant_jobs_running", "gauge", "Jobs running.",
             [](const UsageInfo& u) { return u.jobs_running; });
  per_tenant("tessera_tenant_jobs_succeeded_total", "counter", "Jobs that succeeded.",
             [](const UsageInfo& u) { return u.jobs_succeeded; });
  per_tenant("tessera_tenant_jobs_failed_total", "counter", "Jobs that failed.",
             [](const UsageInfo& u) { return u.jobs_failed; });
  per_tenant("tessera_tenant_jobs_cancelled_total", "counter",
             "Jobs cancelled while queued (expired ones included).",
             [](const UsageInfo& u) { return u.jobs_cancelled; });
  per_tenant("tessera_tenant_jobs_expired_total", "counter",
             "Jobs whose deadline passed while they were queued.",
             [](const UsageInfo& u) { return u.jobs_expired; });
  per_tenant("tessera_tenant_busy_seconds_total", "counter",
             "Time the tenant's work spent executing.",
             [](const UsageInfo& u) { return absl::ToDoubleSeconds(u.busy_time); });
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    const TenantTable* tenants,
                                                                    const Backend* backend) {
  const size_t colon = address.rfind(':');
  int port = 0;
  in_addr host{};
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535 ||
      inet_pton(AF_INET, address.substr(0, colon).c_str(), &host) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen=", address, ": expected IPv4-address:port, e.g. 127.0.0.1:9464"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->tenants_ = tenants;
  server->backend_ = backend;
  server->fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(server->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr = host;
  if (server->fd_ < 0 || bind(server->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(server->fd_, 16) != 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen=", address, ": cannot listen: ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(server->fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  server->port_ = ntohs(addr.sin_port);
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

void MetricsServer::Serve() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    // Read the request head: at most 8 KiB within 2 s.
    std::string request;
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (request.size() < 8192 && request.find("\r\n\r\n") == std::string::npos &&
           absl::Now() < deadline) {
      pollfd c{conn, POLLIN, 0};
      if (poll(&c, 1, 100) <= 0) continue;
      char buffer[1024];
      ssize_t n = read(conn, buffer, sizeof(buffer));
      if (n <= 0) break;
      request.append(buffer, static_cast<size_t>(n));
    }
    std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
    if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
      body = RenderMetrics(*tenants_, *backend_);
    } else {
      status = "404 Not Found";
      type = "text/plain; charset=utf-8";
      body = "only GET /metrics is served here\n";
    }
    std::string response =
        absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                     "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
    for (size_t sent = 0; sent < response.size();) {
      ssize_t n = send(conn, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    close(conn);
  }
}

}  // namespace tessera
