#ifndef TESSERA_SERVER_SERVICE_AUTH_H_
#define TESSERA_SERVER_SERVICE_AUTH_H_

#include <optional>
#include <string>
#include <utility>

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
  /// `directory`: the fleet's (not owned), or null on a single server.
  Authenticator(KeyHash admin_hash, const TenantTable* tenants,
                TenantDirectory* directory = nullptr)
      : admin_hash_(admin_hash), tenants_(tenants), directory_(directory) {}

  /// OK for the admin token; PERMISSION_DENIED for a tenant key; UNAUTHENTICATED otherwise.
  absl::Status AuthorizeAdmin(const grpc::ServerContextBase& context) const;

  /// The runtime of the tenant whose key this is; PERMISSION_DENIED for the admin token;
  /// UNAUTHENTICATED otherwise. Also starts the call in the tenant's RequestGate, holding its
  /// ticket in the call's record (access_log.h) until the call ends: RESOURCE_EXHAUSTED, with
  /// a retry hint (CallLog::Finish sends it as `grpc-retry-pushback-ms`), past
  /// quota.max_requests_in_flight or quota.requests_per_second. (Without the access log
  /// interceptor, as in tests that build a service alone, there is no record and no gate.)
  ///
  /// In a fleet, a valid key of a tenant that lives on another node is FAILED_PRECONDITION
  /// naming that node and its address, which also come as trailing metadata
  /// `tessera-home-address` and `tessera-home-node` (WithHome; docs/fleet.md, "Reaching a
  /// tenant's home"); UNAVAILABLE when that node is not live.
  absl::StatusOr<std::shared_ptr<TenantRuntime>> AuthenticateTenant(
      grpc::ServerContextBase& context) const;

  /// Where the tenant whose key this is lives (Compute.Locate), without starting a call in
  /// its RequestGate: `here` for a tenant of this node; its home's node and address for a
  /// tenant of another node of the fleet; AuthenticateTenant's refusals otherwise.
  struct Location {
    bool here = false;
    std::string node;
    std::string address;
  };
  absl::StatusOr<Location> LocateTenant(const grpc::ServerContextBase& context) const;

 private:
  /// The redirect for a valid key of a tenant homed on another node, or `refused` as it is.
  absl::Status Elsewhere(absl::string_view token, const KeyHash& hash, absl::Status refused) const;

  const KeyHash admin_hash_;
  const TenantTable* const tenants_;
  TenantDirectory* const directory_;
};

/// The payload type of a redirect to a tenant's home ("address node").
inline constexpr char kHomePayload[] = "type.tessera.dev/home";
/// `status` carrying the home's address and node name, sent as trailing metadata by
/// CallLog::Finish.
absl::Status WithHome(absl::Status status, absl::string_view address, absl::string_view node);
/// The home a redirect carries (WithHome): {address, node}; nullopt for any other status.
std::optional<std::pair<std::string, std::string>> HomeOf(const absl::Status& status);

/// The token of the single `authorization: Bearer <token>` entry, or UNAUTHENTICATED.
absl::StatusOr<std::string> BearerToken(const grpc::ServerContextBase& context);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_AUTH_H_
