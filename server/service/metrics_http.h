#ifndef TESSERA_SERVER_SERVICE_METRICS_HTTP_H_
#define TESSERA_SERVER_SERVICE_METRICS_HTTP_H_

// --metrics_listen: GET /metrics (Prometheus text format 0.0.4, rendered by Metrics) over
// HTTP/1.1, or HTTPS with --metrics_tls_cert/--metrics_tls_key, each connection on its own
// thread (at most kMaxConnections at once; each bounded in size and time), so an idle or slow
// client never delays a scrape. Access: a loopback address needs nothing; any other needs a
// bearer token (--metrics_token_file) or client certificates (--metrics_tls_client_ca), and
// an anonymous scrape is refused (401) whenever a token is configured.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace tessera {

class Metrics;

struct MetricsHttpOptions {
  /// "HOST:PORT", "[IPV6]:PORT" or ":PORT" (loopback); HOST may be a name. Port 0 picks one.
  std::string listen;
  /// File holding the bearer token scrapes must present ("" for none).
  std::string token_file;
  /// PEM files: cert and key serve HTTPS; client_ca requires client certificates it signed.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
};

class MetricsServer {
 public:
  static constexpr int kMaxConnections = 32;

  /// Listens. INVALID_ARGUMENT for a malformed address or options (a non-loopback address
  /// without a token or client certificates included), FAILED_PRECONDITION for unreadable
  /// files, UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsHttpOptions& options,
                                                              Metrics* metrics);
  ~MetricsServer();
  int port() const { return port_; }
  /// "http" or "https".
  const char* scheme() const { return ssl_ != nullptr ? "https" : "http"; }
  /// The bound address as host:port ("[::1]:9464" for IPv6).
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  void Accept();
  void Serve(int fd);

  Metrics* metrics_ = nullptr;
  std::string token_;
  SSL_CTX* ssl_ = nullptr;
  int fd_ = -1;
  int port_ = 0;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_METRICS_HTTP_H_
