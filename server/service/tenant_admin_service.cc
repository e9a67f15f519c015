#include "server/service/tenant_admin_service.h"

#include <algorithm>
#include <memory>
#include <utility>

#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "server/common/logging.h"
#include "server/common/status_macros.h"
#include "server/core/admission.h"
#include "server/core/validation.h"
#include "server/service/call.h"
#include "server/service/convert.h"
#include "server/service/unary_call.h"

namespace tessera {
namespace {

constexpr absl::string_view kTenantPages = "tenants";

absl::Status CheckLabelCount(size_t count, absl::string_view field) {
  if (count <= kMaxLabels) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has ", count, " entries; the limit is ", kMaxLabels));
}

// Translates an UpdateTenantRequest into the core's update.
absl::StatusOr<TenantTable::MetadataUpdate> UpdateFromRequest(
    const v1::UpdateTenantRequest& request) {
  const v1::Tenant& tenant = request.tenant();
  RETURN_IF_ERROR(CheckLabelCount(tenant.labels().size(), "tenant.labels"));
  TenantTable::MetadataUpdate update;
  if (request.update_mask().paths_size() == 0) {
    if (!tenant.display_name().empty()) update.display_name = tenant.display_name();
    if (!tenant.labels().empty()) {
      update.labels = Labels(tenant.labels().begin(), tenant.labels().end());
    }
    if (tenant.has_quota()) update.quota = QuotaFromProto(tenant.quota());
    if (!update.display_name && !update.labels && !update.quota) {
      return absl::InvalidArgumentError(
          "nothing to update: set tenant.display_name or tenant.labels, or name them in "
          "update_mask (an empty value with a mask path clears the field)");
    }
    return update;
  }
  for (const std::string& path : request.update_mask().paths()) {
    if (path == "display_name") {
      update.display_name = tenant.display_name();
    } else if (path == "labels") {
      update.labels = Labels(tenant.labels().begin(), tenant.labels().end());
    } else if (path == "quota" || absl::StartsWith(path, "quota.")) {
      update.quota_named = true;
    } else if (path == "tenant_id" || path == "context" || absl::StartsWith(path, "context.") ||
               path == "device_index" || path == "create_time" || path == "update_time" ||
               path == "key_create_time") {
      return absl::InvalidArgumentError(absl::StrCat(
          "update_mask path \"", path,
          "\" cannot be updated (identity or output only); updatable: display_name, labels"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("update_mask path \"", path.substr(0, 64),
                       "\" is not a Tenant field; updatable: display_name, labels"));
    }
  }
  return update;
}

}  // namespace

TenantAdminService::TenantAdminService(TenantTable* tenants, const Backend* backend,
                                       const Authenticator* authenticator,
                                       SerialExecutor* mutations, ServerFacts facts, MpsOps* mps)
    : tenants_(tenants),
      backend_(backend),
      authenticator_(authenticator),
      mutations_(mutations),
      facts_(std::move(facts)),
      mps_(mps) {}

template <typename Body>
grpc::ServerUnaryReactor* TenantAdminService::Serve(grpc::CallbackServerContext* context,
                                                    const char* rpc, bool mutation, Body body) {
  auto authorize = [&](CallLog&) -> absl::StatusOr<bool> {
    RETURN_IF_ERROR(authenticator_->AuthorizeAdmin(*context));
    return true;
  };
  auto run = [context, mutation, body = std::move(body)](bool, CallLog& log) mutable {
    // A mutation waits its turn: the client may have gone meanwhile.
    if (mutation) RETURN_IF_ERROR(CallStillWanted(context));
    return body(log);
  };
  if (!mutation) return ServeUnary(context, rpc, authorize, std::move(run));
  return ServeUnary(context, rpc, authorize, std::move(run),
                    [this](bool, absl::AnyInvocable<void() &&> task) {
                      return mutations_->Schedule(std::move(task));
                    });
}

grpc::ServerUnaryReactor* TenantAdminService::RegisterTenant(
    grpc::CallbackServerContext* context, const v1::RegisterTenantRequest* request,
    v1::RegisterTenantResponse* response) {
  return Serve(
      context, "RegisterTenant", /*mutation=*/true,
      [this, context, request, response](CallLog& log) -> absl::Status {
        log.set_tenant(request->tenant_id().substr(0, kMaxTenantIdLength));
        // Counted before the map is copied: a huge one costs nothing.
        RETURN_IF_ERROR(CheckLabelCount(request->labels().size(), "labels"));
        ASSIGN_OR_RETURN(std::optional<FleetNode> home, PlaceInFleet(*context, *request));
        if (home.has_value()) {
          RETURN_IF_ERROR(ForwardRegistration(*context, *home, *request, response));
          log.Info(absl::StrCat("placed on node ", home->name, " (", home->address, ")"));
          return absl::OkStatus();
        }
        ASSIGN_OR_RETURN(TenantTable::Registered registered,
                         tenants_->Register(TenantSpecFromProto(*request)));
        TenantToProto(registered.tenant, response->mutable_tenant());
        response->set_api_key(std::move(registered.api_key));
        log.Info(absl::StrCat("registered on device ", registered.tenant.record.device_index,
                              ", memory quota ",
                              FormatBytes(registered.tenant.record.quota.device_memory_bytes),
                              ", context ", ContextKindName(registered.tenant.context.kind)));
        if (mps_ != nullptr) mps_->Reconcile(tenants_->TenantsPerDevice());
        if (facts_.directory != nullptr) facts_.directory->CapacityChanged();
        return absl::OkStatus();
      });
}

absl::StatusOr<std::optional<FleetNode>> TenantAdminService::PlaceInFleet(
    const grpc::CallbackServerContext& context, const v1::RegisterTenantRequest& request) {
  if (facts_.directory == nullptr) return std::optional<FleetNode>();
  // Forwarded here by the node that placed it: register here.
  if (context.client_metadata().count(kPlacedByMetadata) != 0) return std::optional<FleetNode>();
  // Between nodes the call goes in plaintext: with TLS, every tenant is placed where it is
  // registered (docs/fleet.md).
  if (facts_.transport_security != "insecure") return std::optional<FleetNode>();
  ASSIGN_OR_RETURN(std::vector<FleetNode> nodes, facts_.directory->Nodes());
  const uint32_t share = request.quota().compute_share_percent() != 0
                             ? request.quota().compute_share_percent()
                             : kDefaultComputeSharePercent;
  const std::optional<size_t> chosen =
      ChooseNode(nodes, request.quota().device_memory_bytes(), share, facts_.placement);
  if (!chosen.has_value()) {
    // No node fits: local admission answers, with this node's numbers, unless this node
    // drains.
    for (const FleetNode& node : nodes) {
      if (node.name == facts_.directory->node_name() && node.draining) {
        return absl::ResourceExhaustedError(
            absl::StrCat("no node of the fleet has room for quota.device_memory_bytes ",
                         FormatBytes(request.quota().device_memory_bytes()), ", and this node (",
                         node.name, ") drains"));
      }
    }
    return std::optional<FleetNode>();
  }
  if (nodes[*chosen].name == facts_.directory->node_name()) return std::optional<FleetNode>();
  return std::optional<FleetNode>(nodes[*chosen]);
}

absl::Status TenantAdminService::ForwardRegistration(const grpc::CallbackServerContext& context,
                                                     const FleetNode& node,
                                                     const v1::RegisterTenantRequest& request,
                                                     v1::RegisterTenantResponse* response) {
  auto stub = v1::TenantAdmin::NewStub(
      grpc::CreateChannel(node.address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext out;
  out.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  for (const char* name : {"authorization", "x-request-id"}) {
    auto [begin, end] = context.client_metadata().equal_range(name);
    for (auto it = begin; it != end; ++it) {
      out.AddMetadata(name, std::string(it->second.data(), it->second.size()));
    }
  }
  out.AddMetadata(kPlacedByMetadata, facts_.directory->node_name());
  grpc::Status status = stub->RegisterTenant(&out, request, response);
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("node ", node.name, " (", node.address,
                                   "), chosen as the tenant's home: ", status.error_message()));
}

grpc::ServerUnaryReactor* TenantAdminService::GetTenant(grpc::CallbackServerContext* context,
                                                        const v1::GetTenantRequest* request,
                                                        v1::Tenant* response) {
  return Serve(context, "GetTenant", /*mutation=*/false,
               [this, request, response](CallLog&) -> absl::Status {
                 RETURN_IF_ERROR(ValidateTenantId(request->tenant_id()));
                 ASSIGN_OR_RETURN(TenantView view, tenants_->Get(request->tenant_id()));
                 TenantToProto(view, response);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* TenantAdminService::ListTenants(grpc::CallbackServerContext* context,
                                                          const v1::ListTenantsRequest* request,
                                                          v1::ListTenantsResponse* response) {
  // In a fleet the list comes from the directory (etcd): off the gRPC threads.
  return Serve(context, "ListTenants", /*mutation=*/facts_.directory != nullptr,
               [this, request, response](CallLog&) -> absl::Status {
                 ASSIGN_OR_RETURN(size_t limit, PageLimit(request->page_size()));
                 std::string after;
                 if (!request->page_token().empty()) {
                   ASSIGN_OR_RETURN(
                       after, DecodePageToken(kTenantPages, request->page_token(), "ListTenants"));
                   // Tokens carry a tenant id; anything else was not issued here.
                   if (!ValidateTenantId(after).ok()) {
                     return absl::InvalidArgumentError(
                         "page_token is not one this API issued; pass next_page_token from a "
                         "ListTenants reply");
                   }
                 }
                 if (facts_.directory != nullptr) {
                   absl::Status listed = ListFleetTenants(after, limit, *response);
                   if (!listed.ok()) {
                     spdlog::warn("ListTenants: the fleet's directory: {}; listing this node's",
                                  std::string(listed.message()));
                   } else {
                     return absl::OkStatus();
                   }
                 }
                 TenantTable::Page page = tenants_->List(after, limit);
                 for (const TenantView& view : page.tenants)
                   TenantToProto(view, response->add_tenants());
                 if (!page.last_id.empty())
                   response->set_next_page_token(EncodePageToken(kTenantPages, page.last_id));
                 response->set_total_size(static_cast<int32_t>(page.total));
                 return absl::OkStatus();
               });
}

absl::Status TenantAdminService::ListFleetTenants(absl::string_view after, size_t limit,
                                                  v1::ListTenantsResponse& response) {
  ASSIGN_OR_RETURN(std::vector<FleetTenant> all, facts_.directory->Tenants());
  std::sort(all.begin(), all.end(),
            [](const FleetTenant& a, const FleetTenant& b) { return a.record.id < b.record.id; });
  auto it =
      std::upper_bound(all.begin(), all.end(), after,
                       [](absl::string_view id, const FleetTenant& t) { return id < t.record.id; });
  for (; it != all.end() && static_cast<size_t>(response.tenants_size()) < limit; ++it) {
    v1::Tenant* tenant = response.add_tenants();
    absl::StatusOr<TenantView> local = tenants_->Get(it->record.id);
    if (local.ok() && it->home_node == facts_.directory->node_name()) {
      TenantToProto(*local, tenant);
    } else {
      TenantView remote;
      remote.record = it->record;
      remote.home_node = it->home_node;
      TenantToProto(remote, tenant);
      tenant->clear_context();  // known to its home only
    }
  }
  if (it != all.end() && response.tenants_size() > 0) {
    response.set_next_page_token(
        EncodePageToken(kTenantPages, response.tenants(response.tenants_size() - 1).tenant_id()));
  }
  response.set_total_size(static_cast<int32_t>(all.size()));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* TenantAdminService::UpdateTenant(grpc::CallbackServerContext* context,
                                                           const v1::UpdateTenantRequest* request,
                                                           v1::Tenant* response) {
  return Serve(context, "UpdateTenant", /*mutation=*/true,
               [this, request, response](CallLog& log) -> absl::Status {
                 const std::string& id = request->tenant().tenant_id();
                 RETURN_IF_ERROR(ValidateTenantId(id, "tenant.tenant_id"));
                 log.set_tenant(id);
                 ASSIGN_OR_RETURN(TenantTable::MetadataUpdate update, UpdateFromRequest(*request));
                 ASSIGN_OR_RETURN(TenantView view, tenants_->Update(id, update));
                 TenantToProto(view, response);
                 log.Info("updated display_name/labels");
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* TenantAdminService::DeregisterTenant(
    grpc::CallbackServerContext* context, const v1::DeregisterTenantRequest* request,
    v1::DeregisterTenantResponse* response) {
  return Serve(
      context, "DeregisterTenant", /*mutation=*/true,
      [this, request, response](CallLog& log) -> absl::Status {
        RETURN_IF_ERROR(ValidateTenantId(request->tenant_id()));
        log.set_tenant(request->tenant_id());
        ASSIGN_OR_RETURN(TenantTable::Deregistered gone,
                         tenants_->Deregister(request->tenant_id()));
        TenantToProto(gone.tenant, response->mutable_tenant());
        response->set_released_memory_bytes(gone.released_memory_bytes);
        log.Info(absl::StrCat("deregistered; released ", FormatBytes(gone.released_memory_bytes)));
        if (mps_ != nullptr) mps_->Reconcile(tenants_->TenantsPerDevice());
        if (facts_.directory != nullptr) facts_.directory->CapacityChanged();
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* TenantAdminService::RotateTenantKey(
    grpc::CallbackServerContext* context, const v1::RotateTenantKeyRequest* request,
    v1::RotateTenantKeyResponse* response) {
  return Serve(context, "RotateTenantKey", /*mutation=*/true,
               [this, request, response](CallLog& log) -> absl::Status {
                 RETURN_IF_ERROR(ValidateTenantId(request->tenant_id()));
                 log.set_tenant(request->tenant_id());
                 ASSIGN_OR_RETURN(TenantTable::RotatedKey rotated,
                                  tenants_->RotateKey(request->tenant_id()));
                 response->set_api_key(std::move(rotated.api_key));
                 TimeToProto(rotated.key_create_time, response->mutable_key_create_time());
                 log.Info("rotated API key; the previous key is revoked");
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* TenantAdminService::GetServerInfo(grpc::CallbackServerContext* context,
                                                            const v1::GetServerInfoRequest*,
                                                            v1::ServerInfo* response) {
  return Serve(context, "GetServerInfo", /*mutation=*/false,
               [this, response](CallLog&) -> absl::Status {
                 response->set_version(facts_.version);
                 response->set_backend(std::string(backend_->name()));
                 response->set_backend_reason(facts_.backend_reason);
                 MpsState mps = backend_->mps();
                 response->set_mps_decision(MpsDecisionToProto(mps.decision));
                 response->set_mps_reason(mps.reason);
                 uint32_t tenant_count = 0;
                 for (const DeviceLoad& load : tenants_->DeviceLoads()) {
                   v1::Device* device = response->add_devices();
                   device->set_index(load.device.index);
                   device->set_name(load.device.name);
                   device->set_memory_bytes(load.device.memory_bytes);
                   device->set_reserved_bytes(load.reserved_bytes);
                   device->set_reservable_bytes(
                       ReservableBytes(load.device.memory_bytes, facts_.memory_overcommit));
                   device->set_tenants(load.contexts);
                   device->set_context_limit(load.device.context_limit);
                   device->set_compute_units(load.device.compute_units);
                   tenant_count += load.contexts;
                 }
                 response->set_memory_overcommit(facts_.memory_overcommit);
                 response->set_tenant_count(tenant_count);
                 TimeToProto(facts_.start_time, response->mutable_start_time());
                 response->set_transport_security(facts_.transport_security);
                 if (facts_.directory != nullptr) {
                   response->set_node_name(facts_.directory->node_name());
                   response->set_fleet_directory(facts_.directory->where());
                 }
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* TenantAdminService::ListNodes(grpc::CallbackServerContext* context,
                                                        const v1::ListNodesRequest*,
                                                        v1::ListNodesResponse* response) {
  // etcd is asked (bounded by its timeout): off the gRPC threads, on the admin executor.
  return Serve(context, "ListNodes", /*mutation=*/true, [this, response](CallLog&) -> absl::Status {
    if (facts_.directory == nullptr) {
      return absl::FailedPreconditionError(
          "this server is not in a fleet (start it with --fleet_etcd)");
    }
    ASSIGN_OR_RETURN(std::vector<FleetNode> nodes, facts_.directory->Nodes());
    for (const FleetNode& node : nodes) {
      v1::Node* n = response->add_nodes();
      n->set_name(node.name);
      n->set_address(node.address);
      n->set_backend(node.backend);
      n->set_draining(node.draining);
      TimeToProto(node.started, n->mutable_start_time());
      for (const FleetDevice& d : node.devices) {
        v1::NodeDevice* device = n->add_devices();
        device->set_index(d.index);
        device->set_name(d.name);
        device->set_memory_bytes(d.memory_bytes);
        device->set_free_memory_bytes(d.free_memory_bytes);
        device->set_tenants(d.tenants);
        device->set_context_limit(d.context_limit);
      }
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TenantAdminService::DrainNode(grpc::CallbackServerContext* context,
                                                        const v1::DrainNodeRequest* request,
                                                        v1::DrainNodeResponse*) {
  return Serve(
      context, "DrainNode", /*mutation=*/true, [this, request](CallLog& log) -> absl::Status {
        if (facts_.directory == nullptr) {
          return absl::FailedPreconditionError(
              "this server is not in a fleet (start it with --fleet_etcd)");
        }
        if (request->name().empty()) {
          return absl::InvalidArgumentError("name: the node's --node_name is required");
        }
        const bool move = request->move_tenants() && !request->undo();
        RETURN_IF_ERROR(facts_.directory->SetDraining(request->name(), !request->undo(), move));
        log.Info(absl::StrCat("node ", request->name(),
                              request->undo() ? " takes new tenants again"
                              : move          ? " drains; its tenants move"
                                              : " drains"));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* TenantAdminService::GetMpsStatus(grpc::CallbackServerContext* context,
                                                           const v1::GetMpsStatusRequest*,
                                                           v1::MpsStatus* response) {
  // Asking the daemons runs processes (bounded by --mps_timeout): off the gRPC threads, on
  // the admin executor.
  return Serve(context, "GetMpsStatus", /*mutation=*/true,
               [this, response](CallLog&) -> absl::Status {
                 MpsState state = backend_->mps();
                 response->set_decision(MpsDecisionToProto(state.decision));
                 response->set_reason(state.reason);
                 response->set_managed(mps_ != nullptr && mps_->managed());
                 if (mps_ == nullptr) return absl::OkStatus();
                 for (const MpsDaemonReport& r : mps_->Report()) {
                   v1::MpsDaemon* d = response->add_daemons();
                   d->set_gpu(r.gpu);
                   d->set_pipe_directory(r.pipe_directory);
                   d->set_pid(r.pid);
                   d->set_managed(r.managed);
                   d->set_started(r.started);
                   d->set_log_directory(r.log_directory);
                   d->set_tenants(r.tenants);
                   for (const MpsServerReport& server : r.servers) {
                     v1::MpsServer* s = d->add_servers();
                     s->set_pid(server.pid);
                     switch (server.state) {
                       case MpsServerState::kInitializing:
                         s->set_state(v1::MPS_SERVER_STATE_INITIALIZING);
                         break;
                       case MpsServerState::kActive:
                         s->set_state(v1::MPS_SERVER_STATE_ACTIVE);
                         break;
                       case MpsServerState::kFault:
                         s->set_state(v1::MPS_SERVER_STATE_FAULT);
                         break;
                       case MpsServerState::kUnknown:
                         break;
                     }
                     for (pid_t c : server.clients) s->add_client_pids(c);
                   }
                   d->set_default_active_thread_percentage(r.default_active_thread_percentage);
                   d->set_default_pinned_mem_limit(r.default_pinned_mem_limit);
                   d->set_error(r.error);
                 }
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* TenantAdminService::TerminateTenantWork(
    grpc::CallbackServerContext* context, const v1::TerminateTenantWorkRequest* request,
    v1::TerminateTenantWorkResponse* response) {
  return Serve(context, "TerminateTenantWork", /*mutation=*/true,
               [this, request, response](CallLog& log) -> absl::Status {
                 RETURN_IF_ERROR(ValidateTenantId(request->tenant_id()));
                 log.set_tenant(request->tenant_id());
                 ASSIGN_OR_RETURN(std::shared_ptr<TenantRuntime> runtime,
                                  tenants_->RuntimeOf(request->tenant_id()));
                 const uint64_t cancelled = runtime->CancelQueuedJobs();
                 response->set_cancelled_jobs(cancelled);
                 response->set_detail(absl::StrCat(
                     "cancelled ", cancelled,
                     " queued job(s); running jobs finish. MPS terminate_client was not used: it "
                     "ends all GPU work of a client process, and every tenant's context lives in "
                     "this server's process (pid ",
                     getpid(), "), so it would stop every tenant"));
                 log.Info(absl::StrCat("terminated work: ", cancelled, " queued job(s) cancelled"));
                 return absl::OkStatus();
               });
}

}  // namespace tessera
