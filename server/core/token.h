#ifndef TESSERA_SERVER_CORE_TOKEN_H_
#define TESSERA_SERVER_CORE_TOKEN_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "server/common/tenant.h"

namespace tessera {

inline constexpr size_t kSecretBytes = 32;  // 256 bits
inline constexpr absl::string_view kTenantKeyPrefix = "tsk_";

/// `n` bytes from the OS CSPRNG (OpenSSL RAND_bytes), base64url without padding.
absl::StatusOr<std::string> RandomToken(size_t n = kSecretBytes);

KeyHash HashCredential(absl::string_view credential);

/// Compares two hashes in time independent of their contents.
bool HashesEqual(const KeyHash& a, const KeyHash& b);

/// A fresh tenant API key, "tsk_<tenant_id>.<43 base64url characters>".
absl::StatusOr<std::string> NewTenantKey(absl::string_view tenant_id);

/// The tenant id a key claims to belong to; empty when the key is not in tenant-key form.
/// The claim means nothing until the key's hash has been checked against that tenant's.
absl::string_view TenantIdOfKey(absl::string_view key);

/// Lowercase hex, for storage and logs of hashes (never of secrets).
std::string HexOf(const KeyHash& hash);

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_TOKEN_H_
