#ifndef TESSERA_SERVER_CORE_ADMIN_TOKEN_H_
#define TESSERA_SERVER_CORE_ADMIN_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"

#include "server/core/token.h"

namespace tessera {

inline constexpr size_t kMinAdminTokenLength = 16;

struct AdminCredential {
  KeyHash hash{};
  /// Where the token came from, for people: a file path or "$TESSERA_ADMIN_TOKEN".
  std::string source;
  /// True when this start generated the token file.
  bool created = false;
  /// Set when the token file is readable by group or others.
  std::string warning;
};

/// The admin credential: `env_value` when non-empty (from TESSERA_ADMIN_TOKEN), else the
/// first line of `path`, which is created with mode 0600 and a fresh 256-bit token when
/// absent. Tokens shorter than kMinAdminTokenLength are refused (FAILED_PRECONDITION).
absl::StatusOr<AdminCredential> LoadOrCreateAdminToken(const std::string& path,
                                                       const std::string& env_value);

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_ADMIN_TOKEN_H_
