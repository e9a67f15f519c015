#ifndef TESSERA_SERVER_SERVICE_TENANT_ADMIN_SERVICE_H_
#define TESSERA_SERVER_SERVICE_TENANT_ADMIN_SERVICE_H_

#include <string>

#include "absl/time/time.h"

#include "server/backend/backend.h"
#include "server/common/serial_executor.h"
#include "server/core/admission.h"
#include "server/core/tenant_directory.h"
#include "server/core/tenant_table.h"
#include "server/mps/ops.h"
#include "server/service/auth.h"
#include "tessera/v1/tenant_admin.grpc.pb.h"

namespace tessera {

/// Facts about the running server reported by GetServerInfo.
struct ServerFacts {
  std::string version;
  std::string backend_reason;
  std::string transport_security;
  double memory_overcommit = 1.0;
  absl::Time start_time;
  /// The fleet's directory (borrowed), or null on a single server.
  TenantDirectory* directory = nullptr;
  /// How RegisterTenant picks a tenant's home in the fleet (--fleet_placement).
  Placement placement = Placement::kSpread;
};

/// Metadata a node adds when it forwards RegisterTenant to the home it chose: the node that
/// receives it registers the tenant itself (no second placement).
inline constexpr char kPlacedByMetadata[] = "tessera-placed-by";

/// tessera.v1.TenantAdmin: a stateless adapter over the TenantTable. Authenticates, maps
/// wire types, and runs mutations (durable commits, context creation) on `mutations` so no
/// gRPC thread waits for the disk or the device. Reads are answered inline.
///
/// All pointers are borrowed and must outlive the service.
class TenantAdminService final : public v1::TenantAdmin::CallbackService {
 public:
  TenantAdminService(TenantTable* tenants, const Backend* backend,
                     const Authenticator* authenticator, SerialExecutor* mutations,
                     ServerFacts facts, MpsOps* mps);

  grpc::ServerUnaryReactor* RegisterTenant(grpc::CallbackServerContext* context,
                                           const v1::RegisterTenantRequest* request,
                                           v1::RegisterTenantResponse* response) override;
  grpc::ServerUnaryReactor* GetTenant(grpc::CallbackServerContext* context,
                                      const v1::GetTenantRequest* request,
                                      v1::Tenant* response) override;
  grpc::ServerUnaryReactor* ListTenants(grpc::CallbackServerContext* context,
                                        const v1::ListTenantsRequest* request,
                                        v1::ListTenantsResponse* response) override;
  grpc::ServerUnaryReactor* UpdateTenant(grpc::CallbackServerContext* context,
                                         const v1::UpdateTenantRequest* request,
                                         v1::Tenant* response) override;
  grpc::ServerUnaryReactor* DeregisterTenant(grpc::CallbackServerContext* context,
                                             const v1::DeregisterTenantRequest* request,
                                             v1::DeregisterTenantResponse* response) override;
  grpc::ServerUnaryReactor* RotateTenantKey(grpc::CallbackServerContext* context,
                                            const v1::RotateTenantKeyRequest* request,
                                            v1::RotateTenantKeyResponse* response) override;
  /// In a fleet: the node RegisterTenant should go to (the name of a node other than this
  /// one, with its address), or nullopt to register here. UNAVAILABLE when etcd cannot be
  /// reached.
  absl::StatusOr<std::optional<FleetNode>> PlaceInFleet(const grpc::CallbackServerContext& context,
                                                        const v1::RegisterTenantRequest& request);
  /// RegisterTenant at `node`, with the caller's credentials.
  absl::Status ForwardRegistration(const grpc::CallbackServerContext& context,
                                   const FleetNode& node, const v1::RegisterTenantRequest& request,
                                   v1::RegisterTenantResponse* response);

  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* context,
                                      const v1::DrainNodeRequest* request,
                                      v1::DrainNodeResponse* response) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* context,
                                      const v1::ListNodesRequest* request,
                                      v1::ListNodesResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* GetMpsStatus(grpc::CallbackServerContext* context,
                                         const v1::GetMpsStatusRequest* request,
                                         v1::MpsStatus* response) override;
  grpc::ServerUnaryReactor* TerminateTenantWork(grpc::CallbackServerContext* context,
                                                const v1::TerminateTenantWorkRequest* request,
                                                v1::TerminateTenantWorkResponse* response) override;

 private:
  /// Authorizes the admin, then runs `body` (returning absl::Status) inline or, when
  /// `mutation`, on the mutation executor; finishes the reactor with its status.
  template <typename Body>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, const char* rpc,
                                  bool mutation, Body body);

  TenantTable* const tenants_;
  const Backend* const backend_;
  const Authenticator* const authenticator_;
  /// ListTenants in a fleet: a page of every tenant the directory has (the context only for
  /// this node's). UNAVAILABLE when the directory cannot be reached (nothing added then).
  absl::Status ListFleetTenants(absl::string_view after, size_t limit,
                                v1::ListTenantsResponse& response);

  SerialExecutor* const mutations_;
  const ServerFacts facts_;
  /// Managed MPS daemons follow the tenants per device after each registration change.
  MpsOps* const mps_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_TENANT_ADMIN_SERVICE_H_
