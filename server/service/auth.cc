#include "server/service/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

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
    const grpc::ServerContextBase& context) const {
  absl::StatusOr<std::string> token = BearerToken(context);
  if (!token.ok()) return token.status();
  KeyHash hash = HashCredential(*token);  // hashed once for both checks
  if (HashesEqual(hash, admin_hash_)) {
    return absl::PermissionDeniedError("the admin token cannot call Compute; use a tenant API key");
  }
  return tenants_->AuthenticateKey(*token, hash);
}

}  // namespace tessera
