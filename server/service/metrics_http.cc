#include "server/service/metrics_http.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "server/service/metrics.h"

namespace tessera {
namespace {

constexpr size_t kMaxRequestHead = 8192;
constexpr int kIoTimeoutSeconds = 5;

bool IsLoopback(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "unknown error";
  char buffer[256];
  ERR_error_string_n(e, buffer, sizeof(buffer));
  return buffer;
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("--metrics_token_file=", path, ": cannot read"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(buffer.str()));
  if (token.empty() || token.find_first_of(" \t\r\n") != std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--metrics_token_file=", path, ": must hold one token (no spaces), and is empty"));
  }
  return token;
}

// One connection's bytes, over TLS or not.
class Conn {
 public:
  Conn(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ssize_t Read(char* buffer, size_t size) {
    if (ssl_ != nullptr) return SSL_read(ssl_, buffer, static_cast<int>(size));
    return read(fd_, buffer, size);
  }
  bool WriteAll(absl::string_view data) {
    while (!data.empty()) {
      ssize_t n = ssl_ != nullptr ? SSL_write(ssl_, data.data(), static_cast<int>(data.size()))
                                  : send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

 private:
  int fd_;
  SSL* ssl_;
};

std::string Response(absl::string_view status, absl::string_view type, absl::string_view body,
                     absl::string_view extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                      "Connection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsHttpOptions& options, Metrics* metrics) {
  const std::string& where = options.listen;
  std::string host, port_text;
  bool bracketed = false;
  if (absl::StartsWith(where, "[")) {
    bracketed = true;
    size_t close = where.find("]:");
    if (close != std::string::npos) {
      host = where.substr(1, close - 1);
      port_text = where.substr(close + 2);
    }
  } else if (size_t colon = where.rfind(':'); colon != std::string::npos) {
    host = where.substr(0, colon);
    port_text = where.substr(colon + 1);
  }
  int port = -1;
  if (port_text.empty() || !absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535 ||
      (!bracketed && host.find(':') != std::string::npos)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen=", where,
                     ": expected HOST:PORT, [IPV6]:PORT or :PORT (loopback), e.g. 127.0.0.1:9464"));
  }
  if (host.empty()) host = "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_listen=", where, ": cannot resolve ",
                                                   host, ": ", gai_strerror(rc)));
  }
  absl::Cleanup free_found = [found] { freeaddrinfo(found); };

  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->metrics_ = metrics;
  const bool loopback = IsLoopback(found->ai_addr);
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadToken(options.token_file);
    if (!token.ok()) return token.status();
    server->token_ = *std::move(token);
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--metrics_tls_cert and --metrics_tls_key must be given together");
  }
  if (!options.tls_client_ca.empty() && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--metrics_tls_client_ca (client certificates) needs --metrics_tls_cert and "
        "--metrics_tls_key");
  }
  if (!loopback && server->token_.empty() && options.tls_client_ca.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen=", where,
        " is not a loopback address, and /metrics lists every tenant: give "
        "--metrics_token_file (scrapes send \"Authorization: Bearer TOKEN\") or "
        "--metrics_tls_client_ca with --metrics_tls_cert/--metrics_tls_key (scrapes present "
        "a client certificate), or listen on 127.0.0.1"));
  }
  if (!options.tls_cert.empty()) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    server->ssl_ = ctx;
    if (ctx == nullptr || SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
      return absl::InternalError(absl::StrCat("metrics TLS: ", OpenSslError()));
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, options.tls_cert.c_str()) != 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("--metrics_tls_cert=", options.tls_cert, ": ", OpenSslError()));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, options.tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("--metrics_tls_key=", options.tls_key, ": ", OpenSslError()));
    }
    if (!options.tls_client_ca.empty()) {
      if (SSL_CTX_load_verify_locations(ctx, options.tls_client_ca.c_str(), nullptr) != 1) {
        return absl::FailedPreconditionError(
            absl::StrCat("--metrics_tls_client_ca=", options.tls_client_ca, ": ", OpenSslError()));
      }
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
  }

  server->fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (server->fd_ >= 0) setsockopt(server->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (server->fd_ < 0 || bind(server->fd_, found->ai_addr, found->ai_addrlen) != 0 ||
      ::listen(server->fd_, 64) != 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen=", where, ": cannot listen: ", std::strerror(errno)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(server->fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  char numeric[NI_MAXHOST] = "", service[NI_MAXSERV] = "";
  getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, numeric, sizeof(numeric), service,
              sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV);
  server->port_ = std::atoi(service);
  server->address_ = bound.ss_family == AF_INET6 ? absl::StrCat("[", numeric, "]:", service)
                                                 : absl::StrCat(numeric, ":", service);
  server->acceptor_ = std::thread([s = server.get()] { s->Accept(); });
  return server;
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  if (fd_ >= 0) close(fd_);
  {
    // Connection threads end within their I/O timeouts.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &connections_));
  }
  if (ssl_ != nullptr) SSL_CTX_free(ssl_);
}

void MetricsServer::Accept() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    {
      absl::MutexLock lock(&mu_);
      if (connections_ >= kMaxConnections) {
        close(conn);  // a flood of idle connections costs them theirs, not a scrape
        continue;
      }
      connections_++;
    }
    std::thread([this, conn] {
      Serve(conn);
      absl::MutexLock lock(&mu_);
      connections_--;
    }).detach();
  }
}

void MetricsServer::Serve(int fd) {
  timeval timeout{kIoTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  SSL* ssl = nullptr;
  absl::Cleanup done = [&] {
    if (ssl != nullptr) {
      SSL_shutdown(ssl);
      SSL_free(ssl);
    }
    close(fd);
  };
  if (ssl_ != nullptr) {
    ssl = SSL_new(ssl_);
    if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1 || SSL_accept(ssl) != 1) {
      ERR_clear_error();
      return;  // no certificate, or not TLS: the handshake is the refusal
    }
  }
  Conn conn(fd, ssl);
  std::string request;
  const absl::Time deadline = absl::Now() + absl::Seconds(kIoTimeoutSeconds);
  while (request.size() < kMaxRequestHead && request.find("\r\n\r\n") == std::string::npos &&
         absl::Now() < deadline) {
    char buffer[1024];
    ssize_t n = conn.Read(buffer, sizeof(buffer));
    if (n <= 0) break;
    request.append(buffer, static_cast<size_t>(n));
  }
  const size_t head_end = request.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    conn.WriteAll(Response("400 Bad Request", "text/plain; charset=utf-8",
                           "incomplete or oversized request head\n"));
    return;
  }
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(request).substr(0, head_end), "\r\n");
  std::vector<absl::string_view> first = absl::StrSplit(lines[0], ' ');
  if (first.size() != 3 || !absl::StartsWith(first[2], "HTTP/1.")) {
    conn.WriteAll(
        Response("400 Bad Request", "text/plain; charset=utf-8", "malformed request line\n"));
    return;
  }
  const absl::string_view method = first[0];
  const absl::string_view path = first[1].substr(0, first[1].find('?'));
  if (path != "/metrics") {
    conn.WriteAll(Response("404 Not Found", "text/plain; charset=utf-8",
                           "only GET /metrics is served here\n"));
    return;
  }
  if (method != "GET" && method != "HEAD") {
    conn.WriteAll(Response("405 Method Not Allowed", "text/plain; charset=utf-8",
                           "only GET /metrics is served here\n", "Allow: GET, HEAD\r\n"));
    return;
  }
  if (!token_.empty()) {
    absl::string_view presented;
    for (size_t i = 1; i < lines.size(); ++i) {
      absl::string_view line = lines[i];
      size_t colon = line.find(':');
      if (colon == absl::string_view::npos) continue;
      if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(line.substr(0, colon)),
                                  "authorization")) {
        continue;
      }
      absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
      if (value.size() > 7 && absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) {
        presented = absl::StripAsciiWhitespace(value.substr(7));
      }
    }
    if (presented.size() != token_.size() ||
        CRYPTO_memcmp(presented.data(), token_.data(), token_.size()) != 0) {
      conn.WriteAll(Response("401 Unauthorized", "text/plain; charset=utf-8",
                             "a bearer token is required: Authorization: Bearer TOKEN\n",
                             "WWW-Authenticate: Bearer realm=\"tessera-metrics\"\r\n"));
      return;
    }
  }
  std::string body = metrics_->Render();
  std::string response = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body);
  if (method == "HEAD") response.resize(response.size() - body.size());
  conn.WriteAll(response);
}

}  // namespace tessera
