#ifndef TESSERA_CLIENT_H_
#define TESSERA_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
  absl::StatusOr<v1::MpsStatus> GetMpsStatus();
  absl::StatusOr<v1::TerminateTenantWorkResponse> TerminateTenantWork(absl::string_view tenant_id);

  // ---- Compute (tenant API key) ----
  /// Called during transfers with (bytes done, bytes total).
  using Progress = std::function<void(uint64_t, uint64_t)>;

  /// A tensor from inline bytes (empty: zero-filled); for data larger than one message use
  /// Upload.
  absl::StatusOr<v1::TensorInfo> CreateTensor(const v1::TensorSpec& spec,
                                              absl::string_view data = "");
  /// Streams `data` into a new tensor in chunks of `chunk_bytes`.
  absl::StatusOr<v1::TensorInfo> Upload(const v1::TensorSpec& spec, absl::string_view data,
                                        size_t chunk_bytes = 1 << 20,
                                        const Progress& progress = nullptr);
  /// Streams `data` over an existing tensor (its exact size).
  absl::StatusOr<v1::TensorInfo> Overwrite(absl::string_view handle, absl::string_view data,
                                           size_t chunk_bytes = 1 << 20,
                                           const Progress& progress = nullptr);
  /// Reads a tensor's bytes (or `length` bytes from `offset`; 0: to the end).
  absl::StatusOr<std::string> Download(absl::string_view handle, uint64_t offset = 0,
                                       uint64_t length = 0, uint32_t chunk_bytes = 0,
                                       const Progress& progress = nullptr);
  absl::StatusOr<v1::TensorInfo> GetTensor(absl::string_view handle);
  absl::StatusOr<std::vector<v1::TensorInfo>> ListAllTensors();
  /// Returns the bytes released.
  absl::StatusOr<uint64_t> DeleteTensor(absl::string_view handle);

  absl::StatusOr<v1::Job> Launch(const v1::LaunchRequest& request);
  absl::StatusOr<v1::Job> Submit(const v1::SubmitRequest& request);
  /// Waits up to `timeout` (infinite: until the call's deadline) for the job to finish.
  absl::StatusOr<v1::Job> WaitJob(absl::string_view job_id,
                                  absl::Duration timeout = absl::InfiniteDuration());
  absl::StatusOr<v1::Job> CancelJob(absl::string_view job_id);
  /// Waits for every job enqueued so far on `stream` (< 0: all streams).
  absl::StatusOr<uint64_t> Synchronize(int64_t stream = -1);
  /// The catalog, then this tenant's own kernels (tenant_defined).
  absl::StatusOr<v1::ListKernelsResponse> ListKernels();
  /// Defines a kernel of this tenant from its text form (docs/kernels.md):
  /// "kernel NAME(x: f32) -> (y: f32) { y = x * sigmoid(1.702 * x) }".
  absl::StatusOr<v1::KernelInfo> DefineKernel(absl::string_view source);
  /// The same from a structured definition.
  absl::StatusOr<v1::KernelInfo> DefineKernel(const v1::KernelDefinition& definition);
  absl::Status DeleteKernel(absl::string_view name);
  absl::StatusOr<v1::Usage> GetUsage();

  /// The channel, for stubs this class does not wrap (e.g. grpc.health.v1).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  /// A context with this client's deadline and credentials, for calls on other stubs.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  absl::StatusOr<v1::TensorInfo> Write(const v1::WriteHeader& header, absl::string_view data,
                                       size_t chunk_bytes, const Progress& progress);

  const std::unique_ptr<v1::TenantAdmin::Stub> admin_;
  const std::unique_ptr<v1::Compute::Stub> compute_;
};

/// grpc::Status to absl::Status (same code and message).
absl::Status FromGrpcStatus(const grpc::Status& status);
/// The same, keeping the server's retry hint (its `grpc-retry-pushback-ms` trailer, sent with
/// RESOURCE_EXHAUSTED when a tenant is past its calls in flight or per second, or a transfer
/// queue is full) for RetryAfter. `context` is the finished call's.
absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext& context);

/// How long the server asked the client to wait before retrying the call that failed with
/// `status`; nullopt when it gave no hint (then retrying at once may fail the same way).
/// Every Client method's status carries it.
std::optional<absl::Duration> RetryAfter(const absl::Status& status);

}  // namespace tessera

#endif  // TESSERA_CLIENT_H_
