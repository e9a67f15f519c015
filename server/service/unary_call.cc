#include "server/service/unary_call.h"

namespace tessera {

absl::StatusOr<std::shared_ptr<TenantRuntime>> AuthenticateTenantCall(
    const Authenticator& auth, grpc::CallbackServerContext& context, CallLog& log) {
  absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime = auth.AuthenticateTenant(context);
  if (runtime.ok()) log.set_tenant((*runtime)->tenant_id());
  return runtime;
}

}  // namespace tessera
