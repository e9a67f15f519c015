#ifndef TESSERA_SERVER_SERVICE_AUTH_H_
#define TESSERA_SERVER_SERVICE_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

#include "server/core/tenant_table.h"
#include "server/core/token.h"

namespace tessera {

/// Checks `authorization: Bearer <token>` metadata against the admin credential and the
/// tenant keys. Thread-safe; `tenants` is not owned and must outlive it.
class Authenticator {
 public:
  Authenticator(KeyHash admin_hash, const TenantTable* tenants)
      : admin_hash_(admin_hash), tenants_(tenants) {}

  /// OK for the admin token; PERMISSION_DENIED for a tenant key; UNAUTHENTICATED otherwise.
  absl::Status AuthorizeAdmin(const grpc::ServerContextBase& context) const;

  /// The runtime of the tenant whose key this is; PERMISSION_DENIED for the admin token;
  /// UNAUTHENTICATED otherwise. Also starts the call in the tenant's RequestGate, holding its
  /// ticket in the call's record (access_log.h) until the call ends: RESOURCE_EXHAUSTED, with
  /// a retry hint (CallLog::Finish sends it as `grpc-retry-pushback-ms`), past
  /// quota.max_requests_in_flight or quota.requests_per_second. (Without the access log
  /// interceptor, as in tests that build a service alone, there is no record and no gate.)
  absl::StatusOr<std::shared_ptr<TenantRuntime>> AuthenticateTenant(
      grpc::ServerContextBase& context) const;

 private:
  const KeyHash admin_hash_;
  const TenantTable* const tenants_;
};

/// The token of the single `authorization: Bearer <token>` entry, or UNAUTHENTICATED.
absl::StatusOr<std::string> BearerToken(const grpc::ServerContextBase& context);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_AUTH_H_
