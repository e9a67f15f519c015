#include "server/server.h"

#include <fstream>
#include <sstream>
#include <utility>

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "spdlog/spdlog.h"

#include "server/common/logging.h"
#include "server/common/serial_executor.h"
#include "server/common/status_macros.h"
#include "server/common/telemetry.h"
#include "server/core/admission.h"
#include "server/core/region_tickets.h"
#include "server/core/tenant_table.h"
#include "server/service/auth.h"
#include "server/service/compute_service.h"
#include "server/service/region_socket.h"
#include "server/service/tenant_admin_service.h"
#include "server/store/state_dir.h"
#include "server/store/tenant_store.h"

namespace tessera {
namespace {

constexpr size_t kMaxPendingMutations = 256;

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(flag, "=", path, ": cannot read"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().find("-----BEGIN") == std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(flag, "=", path, ": not a PEM file"));
  }
  return buffer.str();
}

// Drops every server builder plugin (reflection registers itself for every builder when the
// library loads), so a port built with it serves only the services registered on it.
class WithoutPlugins : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};

bool IsLoopback(absl::string_view listen) {
  return absl::StartsWith(listen, "127.") || absl::StartsWith(listen, "localhost:") ||
         absl::StartsWith(listen, "[::1]:");
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca (mutual TLS) needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  ASSIGN_OR_RETURN(std::string cert, ReadPem(options.tls_cert, "--tls_cert"));
  ASSIGN_OR_RETURN(std::string key, ReadPem(options.tls_key, "--tls_key"));
  grpc::SslServerCredentialsOptions ssl(
      options.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                    : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!options.tls_client_ca.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.tls_client_ca, "--tls_client_ca"));
  }
  ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::string_view TesseraVersion() { return TESSERA_VERSION; }

BuildInfo TesseraBuild() {
  return BuildInfo{.version = TESSERA_VERSION,
                   .build_type = TESSERA_BUILD_TYPE,
                   .git_revision = TESSERA_GIT_REVISION,
                   .cuda_toolkit = TESSERA_CUDA_TOOLKIT};
}

Server::Server(ServerOptions options) : options_(std::move(options)) {}

Server::~Server() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  RETURN_IF_ERROR(CheckOptions(options));
  if (options.admin_token_file.empty()) {
    options.admin_token_file = options.state_dir + "/admin.token";
  }
  std::unique_ptr<Server> server(new Server(std::move(options)));
  server->transport_security_ = server->options_.tls_cert.empty()
                                    ? "insecure"
                                    : (server->options_.tls_client_ca.empty() ? "tls" : "mtls");
  RETURN_IF_ERROR(server->OpenState());
  RETURN_IF_ERROR(server->StartBackend());
  RETURN_IF_ERROR(server->RestoreTenants());
  RETURN_IF_ERROR(server->BuildServices());
  return server;
}

absl::Status Server::CheckOptions(const ServerOptions& options) {
  if (options.max_message_bytes < kMinMessageBytes ||
      options.max_message_bytes > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes=", options.max_message_bytes, ": the range is ",
                     kMinMessageBytes, "..", kMaxMessageBytes));
  }
  if (!(options.memory_overcommit >= 0.01 && options.memory_overcommit <= 100)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--memory_overcommit=", options.memory_overcommit, ": the range is 0.01..100"));
  }
  if (options.drain_timeout < absl::ZeroDuration() ||
      options.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout and --shutdown_grace must be >= 0");
  }
  if (options.listen.empty()) return absl::InvalidArgumentError("--listen is empty");
  if (options.max_kernels_per_tenant < 1 || options.max_kernels_per_tenant > 10000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_kernels_per_tenant=", options.max_kernels_per_tenant, ": the range is 1..10000"));
  }
  return absl::OkStatus();
}

absl::Status Server::OpenState() {
  ASSIGN_OR_RETURN(state_dir_, StateDir::Open(options_.state_dir));
  ASSIGN_OR_RETURN(admin_,
                   LoadOrCreateAdminToken(options_.admin_token_file, options_.admin_token_env));
  if (!admin_.warning.empty()) spdlog::warn("{}", admin_.warning);
  return absl::OkStatus();
}

absl::Status Server::StartBackend() {
  // --mps_manage: the daemon must run, and CUDA_MPS_PIPE_DIRECTORY name it, before the
  // backend initializes the driver, which joins a daemon only then (server/mps/manager.h).
  MpsOpsOptions mps_ops = options_.mps_ops;
  if (mps_ops.base_directory.empty()) mps_ops.base_directory = state_dir_->File("mps");
  mps_ = std::make_unique<MpsOps>(std::move(mps_ops));
  RETURN_IF_ERROR(mps_->StartBeforeDriver(
      options_.backend.backend, options_.backend.mps,
      options_.mps_ops.manage && options_.backend.backend != "cpu" && CudaDriverPresent()));

  BackendOptions backend_options = options_.backend;
  if (backend_options.kernel_cache_dir.empty()) {
    backend_options.kernel_cache_dir = state_dir_->File("kernel-cache");
  }
  ASSIGN_OR_RETURN(BackendChoice choice, SelectBackend(backend_options));
  backend_ = std::move(choice.backend);
  backend_reason_ = std::move(choice.reason);
  if (options_.on_backend_fatal) {
    backend_->SetFatalHandler(options_.on_backend_fatal);
  }
  spdlog::info("backend {}: {}", backend_->name(), backend_reason_);
  for (const DeviceInfo& d : backend_->devices()) {
    spdlog::info("device {}: {}, {}", d.index, d.name, FormatBytes(d.memory_bytes));
  }
  spdlog::info("mps: {}", backend_->mps().reason);
  if (backend_->name() == "cpu") mps_->NotNeeded(backend_reason_);
  return absl::OkStatus();
}

absl::Status Server::RestoreTenants() {
  ASSIGN_OR_RETURN(store_, TenantStore::Open(state_dir_->File("tenants.db")));
  if (!options_.fleet.etcd.empty()) RETURN_IF_ERROR(JoinFleet());
  ASSIGN_OR_RETURN(tenants_,
                   TenantTable::Create({.memory_overcommit = options_.memory_overcommit,
                                        .device_in_flight = options_.device_in_flight,
                                        .max_kernels_per_tenant = options_.max_kernels_per_tenant,
                                        .directory = fleet_.get()},
                                       store_.get(), backend_.get()));
  spdlog::info("restored {} tenant(s) from {}", tenants_->size(), state_dir_->File("tenants.db"));
  if (mps_->managed()) {
    // Keeps the report's tenant count and notices a daemon that died.
    mps_->Reconcile(tenants_->TenantsPerDevice());
    mps_monitor_ = std::thread([s = this] {
      while (!s->stop_mps_monitor_.WaitForNotificationWithTimeout(absl::Seconds(2))) {
        s->mps_->Reconcile(s->tenants_->TenantsPerDevice());
      }
    });
  }
  return absl::OkStatus();
}

absl::Status Server::BuildServices() {
  authenticator_ = std::make_unique<Authenticator>(admin_.hash, tenants_.get(), fleet_.get());
  mutations_ = std::make_unique<SerialExecutor>("admin mutations", kMaxPendingMutations);
  admin_service_ = std::make_unique<TenantAdminService>(
      tenants_.get(), backend_.get(), authenticator_.get(), mutations_.get(),
      ServerFacts{
          .version = std::string(TesseraVersion()),
          .backend_reason = backend_reason_,
          .transport_security = transport_security_,
          .memory_overcommit = options_.memory_overcommit,
          .start_time = absl::Now(),
          .directory = fleet_.get(),
          .placement = options_.fleet.placement == "pack" ? Placement::kPack : Placement::kSpread},
      mps_.get());
  RETURN_IF_ERROR(CheckAccessLogOptions(options_.access_log));
  ASSIGN_OR_RETURN(TenantLabel tenant_label, ParseTenantLabel(options_.metrics_tenant_label));
  metrics_ =
      std::make_unique<Metrics>(tenants_.get(), backend_.get(), tenant_label, TesseraBuild());
  telemetry::SetSink(metrics_.get());
  if (!options_.metrics.listen.empty()) {
    ASSIGN_OR_RETURN(metrics_http_, MetricsServer::Start(options_.metrics, metrics_.get()));
    spdlog::info("metrics on {}://{}/metrics ({})", metrics_http_->scheme(),
                 metrics_http_->address(),
                 !options_.metrics.tls_client_ca.empty() ? "client certificates required"
                 : !options_.metrics.token_file.empty()  ? "bearer token required"
                                                         : "loopback only, no token");
  }
  if (!options_.unix_socket.empty()) region_tickets_ = std::make_unique<RegionTickets>();
  compute_service_ = std::make_unique<ComputeService>(
      authenticator_.get(), tenants_.get(), options_.max_message_bytes, region_tickets_.get(),
      region_socket_path(),
      ForwardOptions{.node_name = fleet_ != nullptr ? fleet_->node_name() : "",
                     .forward = options_.fleet.forward && options_.tls_cert.empty()});
  return absl::OkStatus();
}

absl::Status Server::Start() {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, MakeCredentials(options_));
  if (transport_security_ == "insecure" && !IsLoopback(options_.listen)) {
    spdlog::warn(
        "serving without TLS on {}: credentials cross the network in clear text; "
        "set --tls_cert/--tls_key",
        options_.listen);
  }
  grpc::EnableDefaultHealthCheckService(true);
  // The default health service is hand-encoded; linking the descriptors of its messages
  // (server/service/protos) lets reflection describe it, so grpcurl and grpcui can call it.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  if (!options_.health_listen.empty()) RETURN_IF_ERROR(StartHealthPort());
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  if (!options_.unix_socket.empty()) RETURN_IF_ERROR(PrepareUnixSocket());
  grpc::ServerBuilder builder;
  // No SO_REUSEPORT (gRPC's default on Linux): a second server on the same address must fail
  // here, not start and silently take part of the first one's connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options_.listen, credentials, &port_);
  int unix_bound = 0;
  if (!options_.unix_socket.empty()) {
    // Local and guarded by the file's mode: plaintext, with the same tenant and admin
    // credentials as the TCP port.
    builder.AddListeningPort("unix:" + options_.unix_socket, grpc::InsecureServerCredentials(),
                             &unix_bound);
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
  builder.RegisterService(admin_service_.get());
  builder.RegisterService(compute_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  AccessLogOptions access_log = options_.access_log;
  access_log.unix_socket = options_.unix_socket;
  creators.push_back(NewAccessLogFactory(access_log, metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(creators));
  // Sockets are created owner-only, so that nobody connects before their mode and group
  // are set (FinishUnixSocket).
  const mode_t old_mask = options_.unix_socket.empty() ? 0 : umask(0177);
  grpc_server_ = builder.BuildAndStart();
  if (!options_.unix_socket.empty()) umask(old_mask);
  if (grpc_server_ != nullptr && !options_.unix_socket.empty() && unix_bound == 0) {
    grpc_server_->Shutdown();
    grpc_server_.reset();
    return absl::UnavailableError(
        absl::StrCat("--unix_socket=", options_.unix_socket,
                     ": cannot listen there (does the directory exist and is it writable?)"));
  }
  if (grpc_server_ == nullptr || port_ == 0) {
    grpc_server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.listen,
                     ": the address is in use (another tessera-server?) or not an address of "
                     "this host"));
  }
  if (!options_.unix_socket.empty()) {
    if (absl::Status unix_socket = FinishUnixSocket(); !unix_socket.ok()) {
      grpc_server_->Shutdown();
      grpc_server_.reset();
      return unix_socket;
    }
  }
  for (grpc::Server* server : {grpc_server_.get(), health_server_.get()}) {
    if (server == nullptr) continue;
    grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
    health->SetServingStatus(true);
    health->SetServingStatus("tessera.v1.TenantAdmin", true);
    health->SetServingStatus("tessera.v1.Compute", true);
  }
  spdlog::info("serving on port {} ({}), tessera {}", port_, transport_security_, TesseraVersion());
  if (!options_.unix_socket.empty()) {
    spdlog::info(
        "serving on unix:{} (mode 0660{}), regions' descriptor socket {}", options_.unix_socket,
        options_.unix_socket_group.empty() ? ""
                                           : absl::StrCat(", group ", options_.unix_socket_group),
        region_socket_path());
  }
  return absl::OkStatus();
}

std::string Server::region_socket_path() const {
  return options_.unix_socket.empty() ? "" : options_.unix_socket + ".regions";
}

absl::Status Server::PrepareUnixSocket() {
  if (!options_.unix_socket_group.empty()) {
    group buffer{};
    group* found = nullptr;
    std::vector<char> text(16384);
    if (getgrnam_r(options_.unix_socket_group.c_str(), &buffer, text.data(), text.size(), &found) !=
            0 ||
        found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--unix_socket_group=", options_.unix_socket_group, ": no such group on this host"));
    }
    unix_socket_gid_ = found->gr_gid;
  }
  RETURN_IF_ERROR(ClearStaleSocket(options_.unix_socket, "--unix_socket"));
  return ClearStaleSocket(region_socket_path(), "--unix_socket (descriptor socket)");
}

absl::Status Server::FinishUnixSocket() {
  RETURN_IF_ERROR(SetSocketAccess(options_.unix_socket, 0660, unix_socket_gid_, "--unix_socket"));
  ASSIGN_OR_RETURN(region_socket_, RegionSocket::Start(region_socket_path(), 0660, unix_socket_gid_,
                                                       region_tickets_.get()));
  return absl::OkStatus();
}

absl::Status Server::StartHealthPort() {
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<WithoutPlugins>());  // health alone: no reflection
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options_.health_listen, grpc::InsecureServerCredentials(),
                           &health_port_);
  // Health requests are tiny; anything else is UNIMPLEMENTED (the generic service, which
  // also gives the server the callback methods it needs to run without other services).
  builder.SetMaxReceiveMessageSize(64 << 10);
  builder.RegisterCallbackGenericService(&health_unimplemented_);
  health_server_ = builder.BuildAndStart();
  if (health_server_ == nullptr || health_port_ == 0) {
    health_server_.reset();
    return absl::UnavailableError(
        absl::StrCat("--health_listen: cannot listen on ", options_.health_listen,
                     ": the address is in use or not an address of this host"));
  }
  // NOT_SERVING until the main port serves (Start sets both).
  grpc::HealthCheckServiceInterface* health = health_server_->GetHealthCheckService();
  health->SetServingStatus(false);
  health->SetServingStatus("tessera.v1.TenantAdmin", false);
  health->SetServingStatus("tessera.v1.Compute", false);
  spdlog::info("health (grpc.health.v1 only, plaintext) on port {}", health_port_);
  return absl::OkStatus();
}

void Server::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (grpc_server_ != nullptr) {
    // 1. Health NOT_SERVING (overall and per service, on both ports), then give load
    // balancers time.
    grpc_server_->GetHealthCheckService()->Shutdown();
    if (health_server_ != nullptr) health_server_->GetHealthCheckService()->Shutdown();
    spdlog::info("shutting down: health NOT_SERVING");
    if (options_.shutdown_grace > absl::ZeroDuration()) absl::SleepFor(options_.shutdown_grace);
    // 2. Stop accepting; in-flight calls get drain_timeout, then are cancelled.
    grpc_server_->Shutdown(std::chrono::system_clock::now() +
                           absl::ToChronoMilliseconds(options_.drain_timeout));
    grpc_server_->Wait();
  }
  if (health_server_ != nullptr) {
    health_server_->Shutdown(std::chrono::system_clock::now());
    health_server_->Wait();
  }
  // No descriptor arrives once the calls that issue tickets are over; the socket files go.
  region_socket_.reset();
  if (!options_.unix_socket.empty() && grpc_server_ != nullptr) {
    unlink(options_.unix_socket.c_str());
  }
  // 3-4. Queued work is drained and the workers joined.
  if (mutations_ != nullptr) mutations_->Stop();
  metrics_http_.reset();
  // 5. Tenant contexts released, then the managed MPS daemons told to quit.
  if (mps_monitor_.joinable()) {
    stop_mps_monitor_.Notify();
    mps_monitor_.join();
  }
  if (tenants_ != nullptr) tenants_->ReleaseContexts();
  telemetry::SetSink(nullptr);  // no job reports after the contexts are gone
  if (mps_ != nullptr) mps_->Shutdown();
  // 6. The store closed, then the state directory unlocked.
  metrics_.reset();
  tenants_.reset();
  fleet_.reset();  // leaves the fleet: its entry goes at once
  store_.reset();
  state_dir_.reset();
  spdlog::info("shutdown complete");
}

absl::Status Server::JoinFleet() {
  const ServerOptions::Fleet& f = options_.fleet;
  std::string advertise = f.advertise_address;
  if (advertise.empty()) {
    const size_t colon = options_.listen.rfind(':');
    const std::string host = options_.listen.substr(0, colon);
    const std::string port = colon == std::string::npos ? "" : options_.listen.substr(colon + 1);
    if (host.empty() || host == "0.0.0.0" || host == "[::]" || port.empty() || port == "0") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise_address: required in fleet mode when --listen (", options_.listen,
          ") names no host or port other nodes and clients can reach"));
    }
    advertise = options_.listen;
  }
  if (f.placement != "spread" && f.placement != "pack") {
    return absl::InvalidArgumentError(
        absl::StrCat("--fleet_placement=", f.placement, ": allowed values are spread, pack"));
  }
  std::string node = f.node_name;
  if (node.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) node = host;
  }
  if (f.lease_ttl < absl::Seconds(2) || f.lease_ttl > absl::Minutes(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fleet_lease_ttl=", absl::FormatDuration(f.lease_ttl), ": the range is 2s..10m"));
  }
  std::vector<std::string> endpoints = absl::StrSplit(f.etcd, ',', absl::SkipEmpty());
  // The node's devices and what admission has left on each, at every lease renewal.
  auto capacity = [this] {
    std::vector<fleet::DeviceCapacity> devices;
    if (tenants_ == nullptr) {
      for (const DeviceInfo& d : backend_->devices()) {
        devices.push_back({.index = d.index,
                           .name = d.name,
                           .memory_bytes = d.memory_bytes,
                           .free_memory_bytes = d.memory_bytes,
                           .tenants = 0,
                           .context_limit = d.context_limit});
      }
      return devices;
    }
    for (const DeviceLoad& load : tenants_->DeviceLoads()) {
      const uint64_t reservable =
          ReservableBytes(load.device.memory_bytes, options_.memory_overcommit);
      devices.push_back({.index = load.device.index,
                         .name = load.device.name,
                         .memory_bytes = load.device.memory_bytes,
                         .free_memory_bytes = reservable > load.reserved_bytes
                                                  ? reservable - load.reserved_bytes
                                                  : 0,
                         .tenants = load.contexts,
                         .share_percent = load.share_percent,
                         .context_limit = load.device.context_limit});
    }
    return devices;
  };
  ASSIGN_OR_RETURN(fleet_,
                   fleet::Fleet::Join(
                       {.etcd_endpoints = std::move(endpoints),
                        .node_name = node,
                        .advertise_address = advertise,
                        .backend = std::string(backend_->name()),
                        .lease_ttl = f.lease_ttl,
                        .placement = f.placement == "pack" ? Placement::kPack : Placement::kSpread},
                       capacity));
  return absl::OkStatus();
}

size_t Server::tenant_count() const { return tenants_ == nullptr ? 0 : tenants_->size(); }

}  // namespace tessera
