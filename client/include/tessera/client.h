#ifndef TESSERA_CLIENT_H_
#define TESSERA_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

#include "tessera/v1/compute.grpc.pb.h"
#include "tessera/v1/tenant_admin.grpc.pb.h"

namespace tessera {

struct ClientOptions {
  /// host:port of the server.
  std::string address = "127.0.0.1:50051";
  /// Sent as "authorization: Bearer <token>": the admin token for TenantAdmin calls, a
  /// tenant API key for Compute calls. May be empty (calls are then UNAUTHENTICATED).
  std::string token;
  /// Use TLS. With `tls_ca_file` empty, the system roots verify the server.
  bool tls = false;
  std::string tls_ca_file;
  /// Client certificate and key (PEM) for mutual TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
  /// Per-call deadline.
  absl::Duration timeout = absl::Seconds(30);
};

/// A typed client for the Tessera API. Every method returns the server's status as an
/// absl::Status with the same code and message.
///
/// Thread-safe: one Client may be shared by many threads. Connecting is lazy: Connect()
/// validates the options and reads TLS files; the first call dials the server.
class Client {
 public:
  /// INVALID_ARGUMENT for unreadable TLS files or inconsistent options.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);

  // ---- TenantAdmin (admin token) ----
  absl::StatusOr<v1::RegisterTenantResponse> RegisterTenant(
      const v1::RegisterTenantRequest& request);
  absl::StatusOr<v1::Tenant> GetTenant(absl::string_view tenant_id);
  /// One page; `page_size` 0 means the server default (100).
  absl::StatusOr<v1::ListTenantsResponse> ListTenants(int32_t page_size = 0,
                                                      absl::string_view page_token = "");
  /// Every tenant, following page tokens.
  absl::StatusOr<std::vector<v1::Tenant>> ListAllTenants();
  /// Changes the fields named in `paths` ("display_name", "labels") to `tenant`'s values.
  absl::StatusOr<v1::Tenant> UpdateTenant(const v1::Tenant& tenant,
                                          const std::vector<std::string>& paths);
  absl::StatusOr<v1::DeregisterTenantResponse> DeregisterTenant(absl::string_view tenant_id);
  absl::StatusOr<v1::RotateTenantKeyResponse> RotateTenantKey(absl::string_view tenant_id);
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  /// The channel, for stubs this class does not wrap (e.g. grpc.health.v1).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  /// A context with this client's deadline and credentials, for calls on other stubs.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::TenantAdmin::Stub> admin_;
};

/// grpc::Status to absl::Status (same code and message).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tessera

#endif  // TESSERA_CLIENT_H_
