#ifndef TESSERA_CLIENT_H_
#define TESSERA_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

#include "tessera/v1/compute.grpc.pb.h"
#include "tessera/v1/tenant_admin.grpc.pb.h"

namespace tessera {
namespace client_internal {
class ReadSink;
}  // namespace client_internal

struct ClientOptions {
  /// host:port of the server, or "unix:PATH" for its --unix_socket on this node.
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
  /// The same as PEM text, for callers that hold it in memory (e.g. the Python package); each
  /// is used where its `*_file` is empty, and a non-empty one implies `tls`.
  std::string tls_ca_pem;
  std::string tls_cert_pem;
  std::string tls_key_pem;
  /// Per-call deadline (absl::InfiniteDuration(): none).
  absl::Duration timeout = absl::Seconds(30);
  /// With `address` "unix:PATH" (a tessera-server with --unix_socket on this node), Upload,
  /// Overwrite and Download move the bytes through a shared-memory region instead of messages
  /// (docs/api.md, "Clients on the same node"): one copy on each side. The client registers
  /// the region on first need, replaces it with a bigger one when a transfer needs more, reuses
  /// it across calls and unregisters it when destroyed; it counts against the tenant's
  /// Quota.max_region_bytes. Those calls stream as over TCP when the server has no descriptor
  /// socket or the region does not fit the quota. false: always stream. Ignored for other
  /// addresses.
  bool use_regions = true;
  /// In a fleet (docs/fleet.md), a tenant's calls must reach the node it lives on. With a
  /// tenant API key, Connect asks the server once (Compute.Locate, not counted against the
  /// tenant's request quotas); if the tenant lives on
  /// another node, the server answers with that node's address and the client connects
  /// there instead, so every later call, data-heavy ones included, takes no extra hop.
  /// Any other answer (a single server, the tenant at home, the server down) leaves the
  /// client as it was. Every call then carries `tessera-follow-home: 1`, so a node that is
  /// not the tenant's home (the tenant moved) answers the redirect rather than forwarding.
  /// The client also follows a tenant that moves while it is connected (docs/api.md, "After
  /// a move"): a call answered with the redirect (FAILED_PRECONDITION with a
  /// `tessera-home-address` trailer; it did not run) switches the client to that address and
  /// runs once more there; a call answered UNAVAILABLE asks Locate again through `address`
  /// (the seed) and, when it names another home, switches there for the next call (this one
  /// fails: it may have run). At most one switch per call.
  /// false: connect to `address` as given and send no such metadata: a node forwards the
  /// tenant's calls to its home (docs/api.md, "Forwarding and redirects").
  bool follow_home = true;
};

class Client;

/// Cancels a streamed transfer (Upload, Overwrite, Download, DownloadTo) from another thread:
/// the call ends CANCELLED soon after Cancel(), or at once when Cancel() came first. Transfers
/// through a region (one unary call) run to their end. Thread-safe; one Canceller may serve
/// several calls, and stays cancelled.
class Canceller {
 public:
  Canceller() = default;
  /// With a `watch`: a streamed call given this Canceller calls it on the calling thread at
  /// least every `period` (1 ms at the least; infinite: never) while it runs, whether it waits
  /// for the server or not, and `watch` may Cancel(). (The Python package runs Python's signal
  /// handlers in it, so that Ctrl-C ends a transfer.)
  Canceller(std::function<void()> watch, absl::Duration period)
      : watch_(std::move(watch)), period_(period) {}
  Canceller(const Canceller&) = delete;
  Canceller& operator=(const Canceller&) = delete;
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  /// The watch (empty: none) and its period, which the library's waits call.
  const std::function<void()>& watch() const { return watch_; }
  absl::Duration period() const { return period_; }

 private:
  friend class Client;
  // A call's context while it runs; false (not attached) when already cancelled.
  bool Attach(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  void Detach(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<void()> watch_;
  const absl::Duration period_ = absl::InfiniteDuration();
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

/// A shared-memory region registered with the server by this process (docs/api.md,
/// "Registering a region"): a memfd sealed against shrinking, mapped here and in the server,
/// through which Client::UploadFromRegion, OverwriteFromRegion and DownloadIntoRegion move a
/// tensor's bytes with no copy in this process. Needs a client connected to "unix:PATH".
///
/// Not thread-safe: one thread at a time may fill or read the bytes, and never while a call
/// that reads or writes them is in progress. The Client it was registered with must outlive it.
class SharedRegion {
 public:
  /// Creates a memfd of `size_bytes`, maps it, and registers it as `client`'s tenant
  /// (BeginRegion, the descriptor sent to "PATH.regions", FinishRegion). Errors:
  /// FAILED_PRECONDITION (the client's address is not unix:PATH, or the server has no
  /// descriptor socket), RESOURCE_EXHAUSTED (Quota.max_region_bytes, the region count),
  /// INVALID_ARGUMENT (size 0 or above 1 TiB), INTERNAL (a system call failed here), and every
  /// other refusal of the server with its code.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Register(Client& client,
                                                                uint64_t size_bytes);
  /// Unregisters the region (UnregisterRegion, errors ignored) and unmaps it.
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  /// The region's bytes, `size()` of them, shared with the server.
  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  /// The server's handle ("rg_..."), for requests this class does not wrap.
  const std::string& handle() const { return handle_; }

 private:
  SharedRegion(Client* client, char* data, uint64_t size);

  Client* const client_;
  char* const data_;
  const uint64_t size_;
  std::string handle_;  // "" until registered
};

/// A typed client for the Tessera API. Every method returns the server's status as an
/// absl::Status with the same code and message.
///
/// Thread-safe: one Client may be shared by many threads. Connecting is lazy: Connect()
/// validates the options and reads TLS files; the first call dials the server. When the
/// client follows its tenant to another node (ClientOptions::follow_home), the switch is
/// atomic: each call runs on the connection it started with (and, after a redirect, once on
/// the new one); calls that start later use the new one.
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
  /// The nodes of the server's fleet (FAILED_PRECONDITION on a single server).
  absl::StatusOr<v1::ListNodesResponse> ListNodes();
  /// Marks a node of the fleet draining (or not, with `undo`); `move_tenants` also moves its
  /// tenants to other nodes (DrainNodeRequest.move_tenants).
  absl::Status DrainNode(const std::string& name, bool undo = false, bool move_tenants = false);
  absl::StatusOr<v1::MpsStatus> GetMpsStatus();
  absl::StatusOr<v1::TerminateTenantWorkResponse> TerminateTenantWork(absl::string_view tenant_id);

  // ---- Compute (tenant API key) ----
  /// Called during transfers with (bytes done, bytes total); once, at the end, for a transfer
  /// through a region.
  using Progress = std::function<void(uint64_t, uint64_t)>;

  /// A tensor from inline bytes (empty: zero-filled); for data larger than one message use
  /// Upload.
  absl::StatusOr<v1::TensorInfo> CreateTensor(const v1::TensorSpec& spec,
                                              absl::string_view data = "");
  /// Streams `data` into a new tensor in chunks of `chunk_bytes` (through a region instead
  /// with ClientOptions::use_regions: one copy into it, no chunks). Streamed, each chunk is
  /// sent from `data` where it lies, never copied; `data` is read until the call returns.
  /// `cancel` (here and below), when given, ends the call CANCELLED from another thread.
  absl::StatusOr<v1::TensorInfo> Upload(const v1::TensorSpec& spec, absl::string_view data,
                                        size_t chunk_bytes = 1 << 20,
                                        const Progress& progress = nullptr,
                                        Canceller* cancel = nullptr);
  /// Streams `data` over an existing tensor (its exact size); through a region as Upload.
  absl::StatusOr<v1::TensorInfo> Overwrite(absl::string_view handle, absl::string_view data,
                                           size_t chunk_bytes = 1 << 20,
                                           const Progress& progress = nullptr,
                                           Canceller* cancel = nullptr);
  /// Reads a tensor's bytes (or `length` bytes from `offset`; 0: to the end); through a
  /// region (one copy out of it) with ClientOptions::use_regions.
  absl::StatusOr<std::string> Download(absl::string_view handle, uint64_t offset = 0,
                                       uint64_t length = 0, uint32_t chunk_bytes = 0,
                                       const Progress& progress = nullptr,
                                       Canceller* cancel = nullptr);
  /// Where DownloadTo writes: called once, as soon as the server has said how many bytes
  /// come (`info` is the tensor, `bytes` what this read returns), before any is written. It
  /// returns memory for `bytes` bytes that stays valid until DownloadTo returns, or an error,
  /// which cancels the call and is DownloadTo's answer.
  using Destination =
      absl::FunctionRef<absl::StatusOr<char*>(const v1::TensorInfo& info, uint64_t bytes)>;
  /// Download into memory the caller provides (one copy into it, no std::string): for callers
  /// that own their buffers, such as the Python package's arrays. Returns the tensor's
  /// TensorInfo; the bytes written are `length`, or from `offset` to the end. DATA_LOSS when
  /// the server sends other than it announced.
  absl::StatusOr<v1::TensorInfo> DownloadTo(absl::string_view handle, Destination destination,
                                            uint64_t offset = 0, uint64_t length = 0,
                                            uint32_t chunk_bytes = 0,
                                            const Progress& progress = nullptr,
                                            Canceller* cancel = nullptr);
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

  // ---- Shared-memory regions (a server on this node at unix:PATH; docs/api.md) ----
  // SharedRegion::Register does the whole registration; these are the RPCs underneath.
  absl::StatusOr<v1::RegionTicket> BeginRegion(uint64_t size_bytes);
  absl::StatusOr<v1::Region> FinishRegion(absl::string_view ticket);
  /// The tenant's regions, ordered by handle (also those of other clients of the tenant).
  absl::StatusOr<v1::ListRegionsResponse> ListRegions();
  /// Returns the bytes released. FAILED_PRECONDITION while a transfer uses the region.
  absl::StatusOr<uint64_t> UnregisterRegion(absl::string_view handle);
  absl::StatusOr<v1::TensorInfo> WriteTensorFromRegion(
      const v1::WriteTensorFromRegionRequest& request);
  absl::StatusOr<v1::ReadTensorIntoRegionResponse> ReadTensorIntoRegion(
      const v1::ReadTensorIntoRegionRequest& request);

  /// With no copy in this process: a new tensor from `region`'s bytes at `offset` (the
  /// caller filled them), or an existing tensor replaced whole from them.
  absl::StatusOr<v1::TensorInfo> UploadFromRegion(const v1::TensorSpec& spec,
                                                  const SharedRegion& region, uint64_t offset = 0);
  absl::StatusOr<v1::TensorInfo> OverwriteFromRegion(absl::string_view handle,
                                                     const SharedRegion& region,
                                                     uint64_t offset = 0);
  /// A tensor's bytes (or `length` from `offset`; 0: to the end) into `region` at
  /// `region_offset`; the response says how many. Read them once this returned.
  absl::StatusOr<v1::ReadTensorIntoRegionResponse> DownloadIntoRegion(absl::string_view handle,
                                                                      const SharedRegion& region,
                                                                      uint64_t region_offset = 0,
                                                                      uint64_t offset = 0,
                                                                      uint64_t length = 0);

  /// Exclusive use of one of the regions this client keeps for its transfers (the ones
  /// Upload, Overwrite and Download use), until the lease is destroyed, which gives it back.
  /// Movable; must not outlive the Client.
  class RegionLease {
   public:
    RegionLease(RegionLease&& other) noexcept;
    RegionLease& operator=(RegionLease&&) = delete;
    ~RegionLease();
    const SharedRegion& region() const { return *region_; }
    char* data() const { return region_->data(); }
    uint64_t size() const { return region_->size(); }

   private:
    friend class Client;
    RegionLease(Client* client, std::unique_ptr<SharedRegion> region);
    Client* client_;
    std::unique_ptr<SharedRegion> region_;
  };
  /// A kept region of at least `size_bytes`, registering (or replacing with a bigger one) as
  /// needed, for callers that fill or read the bytes themselves (UploadFromRegion,
  /// DownloadIntoRegion) instead of handing this client a buffer. Thread-safe: concurrent
  /// leases get different regions. nullopt when this client moves no bytes through regions
  /// (use_regions is false, the address is not unix:PATH, the server has no descriptor
  /// socket, or the region does not fit the tenant's quota): stream instead. Errors are the
  /// server's other refusals (UNAUTHENTICATED, ...).
  absl::StatusOr<std::optional<RegionLease>> LeaseTransferRegion(uint64_t size_bytes);

  /// The channel to address(), for stubs this class does not wrap (e.g. grpc.health.v1).
  /// After the client follows its tenant to another node, a new channel: take it again.
  std::shared_ptr<grpc::Channel> channel() const ABSL_LOCKS_EXCLUDED(mu_);
  /// The server this client talks to now: ClientOptions::address, or the tenant's home node
  /// when the client followed it there (ClientOptions::follow_home), at Connect or later.
  std::string address() const ABSL_LOCKS_EXCLUDED(mu_);
  /// A context with this client's deadline and credentials, for calls on other stubs.
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  /// PATH when address() is "unix:PATH" (or "unix://PATH"), else "". Regions are node-local:
  /// after the client follows its tenant to another node its transfers stream.
  std::string unix_socket_path() const ABSL_LOCKS_EXCLUDED(mu_);

  /// Unregisters the regions this client keeps (no RegionLease may be outstanding).
  ~Client();

 private:
  friend class SharedRegion;  // its registration uses the options (address, deadline)
  class RegionPool;
  // Where calls go: an address with its channel and stubs; replaced whole when the client
  // follows its tenant, never changed.
  struct Connection;
  using Attempt = absl::FunctionRef<grpc::Status(const Connection&, grpc::ClientContext*)>;

  // `options.address` is where calls go first; `seed_address` where Locate is asked.
  Client(ClientOptions options, std::string seed_address,
         std::shared_ptr<grpc::ChannelCredentials> credentials);
  static std::shared_ptr<const Connection> Open(
      const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials);
  std::shared_ptr<const Connection> Current() const ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `attempt` with a fresh context on the current connection; when the answer is the
  // redirect, once more on the tenant's home (FollowAfter). The status keeps the retry hint.
  // Each context is attached to `cancel` (when given) while its attempt runs.
  absl::Status Run(Attempt attempt, Canceller* cancel = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(Call call);
  // After a failed call on `used`: the connection to run it on again (the redirect named
  // another node, now current), or nullptr. UNAVAILABLE asks the seed where the tenant lives
  // and switches there for later calls (returns nullptr: the call may have run).
  std::shared_ptr<const Connection> FollowAfter(const std::shared_ptr<const Connection>& used,
                                                const grpc::Status& status,
                                                const grpc::ClientContext& context)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Compute.Locate through the seed: the tenant's home address (the seed's when `here`), or
  // nullopt when the seed does not say.
  std::optional<std::string> AskHome() const;
  // Makes `address` current unless another call switched since `used` (then keeps that);
  // returns the current connection.
  std::shared_ptr<const Connection> SwitchTo(const std::shared_ptr<const Connection>& used,
                                             const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<v1::TensorInfo> Write(const v1::WriteHeader& header, absl::string_view data,
                                       size_t chunk_bytes, const Progress& progress,
                                       Canceller* cancel);
  // The region paths of Write and Download; nullopt when they stream instead.
  std::optional<absl::StatusOr<v1::TensorInfo>> WriteThroughRegion(const v1::WriteHeader& header,
                                                                   absl::string_view data);
  // ReadThroughRegion returns the bytes it read into `sink`.
  std::optional<absl::StatusOr<uint64_t>> ReadThroughRegion(absl::string_view handle,
                                                            uint64_t offset, uint64_t length,
                                                            client_internal::ReadSink* sink);
  // Download and DownloadTo: through a region or the stream, into `sink`.
  absl::Status Read(absl::string_view handle, uint64_t offset, uint64_t length,
                    uint32_t chunk_bytes, const Progress& progress, Canceller* cancel,
                    client_internal::ReadSink* sink);
  void ReturnRegion(std::unique_ptr<SharedRegion> region);

  const ClientOptions options_;  // address: where Connect sent the first calls
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const bool follows_;                            // follow_home with a tenant key
  const std::shared_ptr<const Connection> seed_;  // ClientOptions::address as given
  // Of the address at Connect: regions are used only there (a switch turns them off).
  const std::string unix_socket_path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Connection> connection_ ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<RegionPool> regions_;
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

/// How long `job` ran on the server (its end_time less its start_time); nullopt until it has
/// both, e.g. while it is queued or running, or when it was cancelled before it started.
std::optional<absl::Duration> JobRunTime(const v1::Job& job);

}  // namespace tessera

#endif  // TESSERA_CLIENT_H_
