#include "server/service/auth.h"

#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include "server/core/request_gate.h"
#include "server/service/access_log.h"

namespace tessera {

absl::StatusOr<std::string> BearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto [begin, end] = metadata.equal_range("authorization");
  if (begin == end) {
    return absl::UnauthenticatedError(
        "missing credentials: send metadata \"authorization: Bearer <token>\"");
  }
  if (std::next(begin) != end) {
    return absl::UnauthenticatedError("more than one authorization metadata entry");
  }
  absl::string_view value(begin->second.data(), begin->second.size());
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() || !absl::StartsWithIgnoreCase(value, kScheme)) {
    return absl::UnauthenticatedError("authorization metadata must be \"Bearer <token>\"");
  }
  value.remove_prefix(kScheme.size());
  return std::string(absl::StripAsciiWhitespace(value));
}

absl::Status Authenticator::AuthorizeAdmin(const grpc::ServerContextBase& context) const {
  absl::StatusOr<std::string> token = BearerToken(context);
  if (!token.ok()) return token.status();
  KeyHash hash = HashCredential(*token);  // hashed once for both checks
  if (HashesEqual(hash, admin_hash_)) return absl::OkStatus();
  if (tenants_->AuthenticateKey(*token, hash).ok()) {
    return absl::PermissionDeniedError(
        "a tenant API key cannot call TenantAdmin; use the admin token");
  }
  return absl::UnauthenticatedError("invalid admin token");
}

absl::StatusOr<std::shared_ptr<TenantRuntime>> Authenticator::AuthenticateTenant(
    grpc::ServerContextBase& context) const {
  absl::StatusOr<std::string> token = BearerToken(context);
  if (!token.ok()) return token.status();
  KeyHash hash = HashCredential(*token);  // hashed once for both checks
  if (HashesEqual(hash, admin_hash_)) {
    return absl::PermissionDeniedError("the admin token cannot call Compute; use a tenant API key");
  }
  absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime = tenants_->AuthenticateKey(*token, hash);
  if (!runtime.ok()) return Elsewhere(*token, hash, runtime.status());
  std::shared_ptr<CallRecord> record = FindCallRecord(&context);
  if (record == nullptr || record->has_lease()) return runtime;
  absl::StatusOr<std::unique_ptr<RequestGate::Ticket>> ticket = (*runtime)->requests().Begin();
  if (!ticket.ok()) {
    record->set_tenant((*runtime)->tenant_id());  // the access line names who was refused
    return ticket.status();  // its retry hint becomes a trailer in CallLog::Finish
  }
  // Holds the runtime too: the gate lives in it, and a deregistered tenant's calls may end
  // after the table has let go of it.
  struct Lease {
    std::shared_ptr<TenantRuntime> runtime;
    std::unique_ptr<RequestGate::Ticket> ticket;  // destroyed first
  };
  record->set_lease(std::make_shared<Lease>(Lease{*runtime, *std::move(ticket)}));
  return runtime;
}

absl::StatusOr<Authenticator::Location> Authenticator::LocateTenant(
    const grpc::ServerContextBase& context) const {
  absl::StatusOr<std::string> token = BearerToken(context);
  if (!token.ok()) return token.status();
  KeyHash hash = HashCredential(*token);
  if (HashesEqual(hash, admin_hash_)) {
    return absl::PermissionDeniedError("the admin token cannot call Compute; use a tenant API key");
  }
  absl::Status refused = tenants_->AuthenticateKey(*token, hash).status();
  if (refused.ok()) {
    return Location{.here = true,
                    .node = directory_ != nullptr ? directory_->node_name() : std::string()};
  }
  absl::Status elsewhere = Elsewhere(*token, hash, refused);
  if (auto home = HomeOf(elsewhere); home.has_value()) {
    return Location{.here = false, .node = home->second, .address = home->first};
  }
  return elsewhere;
}

std::optional<std::pair<std::string, std::string>> HomeOf(const absl::Status& status) {
  auto payload = status.GetPayload(kHomePayload);
  if (!payload.has_value()) return std::nullopt;
  const std::string text(*payload);
  const size_t space = text.find(' ');
  return std::make_pair(text.substr(0, space),
                        space == std::string::npos ? std::string() : text.substr(space + 1));
}

absl::Status WithHome(absl::Status status, absl::string_view address, absl::string_view node) {
  status.SetPayload(kHomePayload, absl::Cord(absl::StrCat(address, " ", node)));
  return status;
}

absl::Status Authenticator::Elsewhere(absl::string_view token, const KeyHash& hash,
                                      absl::Status refused) const {
  if (directory_ == nullptr || !absl::IsUnauthenticated(refused)) return refused;
  const absl::string_view id = TenantIdOfKey(token);
  if (id.empty()) return refused;
  absl::StatusOr<std::optional<TenantHome>> home = directory_->FindTenant(id);
  // The same answer as for any bad key unless the caller holds this tenant's key: a redirect
  // reveals nothing to anyone else.
  if (!home.ok() || !home->has_value() || !HashesEqual((*home)->key_hash, hash) ||
      (*home)->node == directory_->node_name()) {
    return refused;
  }
  if ((*home)->address.empty()) {
    return absl::UnavailableError(
        absl::StrCat("tenant \"", id, "\" lives on node ", (*home)->node,
                     ", which is not live in the fleet now; retry later"));
  }
  return WithHome(absl::FailedPreconditionError(absl::StrCat(
                      "tenant \"", id, "\" lives on node ", (*home)->node, " at ", (*home)->address,
                      "; connect there (the C++ and Python clients follow this redirect)")),
                  (*home)->address, (*home)->node);
}

}  // namespace tessera
