#ifndef TESSERA_SERVER_SERVER_H_
#define TESSERA_SERVER_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <sys/types.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"

#include "server/backend/select.h"
#include "server/core/admin_token.h"
#include "server/fleet/fleet.h"
#include "server/mps/ops.h"
#include "server/service/access_log.h"
#include "server/service/metrics.h"
#include "server/service/metrics_http.h"

namespace tessera {

class Authenticator;
class RegionSocket;
class RegionTickets;
class ComputeService;
class SerialExecutor;
class StateDir;
class TenantAdminService;
class TenantStore;
class TenantTable;

struct ServerOptions {
  /// host:port to listen on; port 0 picks a free one (see Server::port()).
  std::string listen = "127.0.0.1:50051";
  /// --unix_socket: a Unix-domain socket path served beside `listen` (plaintext, same
  /// services and authentication; file mode 0660), with the descriptor socket for
  /// shared-memory regions at PATH.regions. Empty: neither.
  std::string unix_socket;
  /// --unix_socket_group: the group given both sockets (empty: the server's own).
  std::string unix_socket_group;
  std::string state_dir = "./var";
  /// Empty: <state_dir>/admin.token.
  std::string admin_token_file;
  /// The value of TESSERA_ADMIN_TOKEN (overrides the file when non-empty).
  std::string admin_token_env;
  BackendOptions backend;
  /// MPS operations (--mps_manage, --mps_base_dir, --mps_control, --mps_timeout); an empty
  /// base directory means <state_dir>/mps.
  MpsOpsOptions mps_ops;
  /// --health_listen: a plaintext port serving only grpc.health.v1, mirroring the main
  /// port's status (for probes that cannot speak TLS, such as the kubelet's); empty: off.
  std::string health_listen;
  /// --metrics_listen (empty: off), its token, TLS and client certificates.
  MetricsHttpOptions metrics;
  /// --metrics_tenant_label: id, hash or none.
  std::string metrics_tenant_label = "id";
  /// --access_log, --access_log_sample.
  AccessLogOptions access_log;
  /// PEM files; cert and key together enable TLS, client_ca adds mutual TLS.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  /// Largest message either way, bytes.
  int64_t max_message_bytes = 64 << 20;
  double memory_overcommit = 1.0;
  /// Most jobs released to a device at once, all tenants together (0: the backend's
  /// default); above it jobs wait in the core's queues in weighted fair order.
  uint32_t device_in_flight = 0;
  /// Tenant-defined kernels per tenant (DefineKernel refuses more).
  size_t max_kernels_per_tenant = 64;
  /// Time between health NOT_SERVING and closing the port, for load balancers to notice.
  absl::Duration shutdown_grace = absl::ZeroDuration();
  /// Longest wait for in-flight calls at shutdown before they are cancelled.
  absl::Duration drain_timeout = absl::Seconds(10);
  /// Fleet mode (docs/fleet.md): --fleet_etcd (comma-separated http://HOST:PORT; empty: a
  /// single server), --node_name, --advertise_address (default: `listen` when it names a
  /// host and a port), --fleet_lease_ttl.
  struct Fleet {
    std::string etcd;
    std::string node_name;
    std::string advertise_address;
    absl::Duration lease_ttl = absl::Seconds(10);
    /// --fleet_placement: "spread" or "pack" (Placement).
    std::string placement = "spread";
    /// --fleet_forward: a tenant's calls reaching this node are forwarded to its home
    /// (forward.h); false: they get the redirect. A node serving TLS never forwards.
    bool forward = true;
  } fleet;
  /// Called once, from a backend thread, when the backend can run nothing more in this
  /// process (Backend::SetFatalHandler); tessera-server then shuts down and exits 75 for its
  /// supervisor to restart it. Unset: the server keeps answering UNAVAILABLE.
  std::function<void(const absl::Status&)> on_backend_fatal;
};

inline constexpr int64_t kMinMessageBytes = 64 << 10;
inline constexpr int64_t kMaxMessageBytes = (int64_t{1} << 31) - 1;

/// The Tessera server: owns every component and wires them together.
///
/// Create() validates the options and opens state (state dir lock, admin credential,
/// backend, durable tenant table with contexts restored); Start() serves; Shutdown() stops
/// in one fixed order. Not copyable; Start/Shutdown from one controlling thread.
class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Create(ServerOptions options);
  /// Shuts down if still running.
  ~Server();

  /// Binds and serves. UNAVAILABLE when the address cannot be bound.
  absl::Status Start();

  /// Stops, in order: health NOT_SERVING; wait shutdown_grace; stop accepting calls and
  /// drain in-flight ones (cancelled after drain_timeout); finish queued admin work; release
  /// tenant contexts; close the store. Idempotent.
  void Shutdown();

  /// The bound port (after Start).
  int port() const { return port_; }
  /// The descriptor socket's path ("" without --unix_socket).
  std::string region_socket_path() const;
  /// The bound --health_listen port (after Start; 0 when off).
  int health_port() const { return health_port_; }
  const AdminCredential& admin_credential() const { return admin_; }
  const std::string& backend_reason() const { return backend_reason_; }
  /// "insecure", "tls" or "mtls".
  const std::string& transport_security() const { return transport_security_; }
  size_t tenant_count() const;

 private:
  // Create's steps, in order.
  /// The flags' ranges (INVALID_ARGUMENT naming the flag).
  static absl::Status CheckOptions(const ServerOptions& options);
  /// Locks the state directory and loads (or creates) the admin token.
  absl::Status OpenState();
  /// Starts managed MPS daemons (before the driver initializes), then picks the backend.
  absl::Status StartBackend();
  /// Opens the store, joins the fleet, restores the tenants and their contexts, and starts
  /// the MPS monitor.
  absl::Status RestoreTenants();
  /// The authenticator, the admin and compute services, metrics.
  absl::Status BuildServices();
  /// --fleet_etcd: joins the fleet (fleet_) before the tenant table exists.
  absl::Status JoinFleet();
  explicit Server(ServerOptions options);
  absl::Status StartHealthPort();
  /// Checks --unix_socket's path before gRPC binds it (gRPC itself would silently replace a
  /// live server's socket).
  absl::Status PrepareUnixSocket();
  /// Sets the socket's mode and group and starts the descriptor socket.
  absl::Status FinishUnixSocket();

  const ServerOptions options_;
  std::string transport_security_;
  std::string backend_reason_;
  AdminCredential admin_;
  int port_ = 0;
  int health_port_ = 0;
  bool shut_down_ = false;

  // Declared in dependency order: destroyed in reverse.
  std::unique_ptr<StateDir> state_dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MpsOps> mps_;
  std::unique_ptr<TenantStore> store_;
  // Before the tenant table, which writes to it; leaves the fleet after the table is gone.
  std::unique_ptr<fleet::Fleet> fleet_;
  std::unique_ptr<TenantTable> tenants_;
  std::unique_ptr<Authenticator> authenticator_;
  std::unique_ptr<SerialExecutor> mutations_;
  std::unique_ptr<TenantAdminService> admin_service_;
  std::unique_ptr<RegionTickets> region_tickets_;
  std::unique_ptr<ComputeService> compute_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<RegionSocket> region_socket_;
  gid_t unix_socket_gid_ = static_cast<gid_t>(-1);
  grpc::CallbackGenericService health_unimplemented_;
  std::unique_ptr<grpc::Server> health_server_;
  std::unique_ptr<Metrics> metrics_;  // also the telemetry sink while set
  std::unique_ptr<MetricsServer> metrics_http_;
  // --mps_manage: notices a daemon that died and starts it again while tenants need it.
  absl::Notification stop_mps_monitor_;
  std::thread mps_monitor_;
};

/// The version string reported by GetServerInfo and --version.
absl::string_view TesseraVersion();
/// The build's type (CMAKE_BUILD_TYPE), git revision ("unknown" outside a checkout) and the
/// CUDA toolkit the module was built with ("" without one).
BuildInfo TesseraBuild();

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVER_H_
