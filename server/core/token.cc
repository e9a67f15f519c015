#include "server/core/token.h"

#include <string>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<std::string> RandomToken(size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError("RAND_bytes failed: the OS random source is unavailable");
  }
  return absl::WebSafeBase64Escape(bytes);  // base64url, no padding
}

KeyHash HashCredential(absl::string_view credential) {
  // OpenSSL 3's one-shot SHA256() looks the algorithm up in the provider table on every call
  // (a global lock and ~2.5x the hash itself); every authenticated call hashes its key, so
  // the implementation is fetched once.
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  KeyHash out;
  unsigned int size = 0;
  if (sha256 == nullptr ||
      EVP_Digest(credential.data(), credential.size(), out.data(), &size, sha256, nullptr) != 1) {
    SHA256(reinterpret_cast<const unsigned char*>(credential.data()), credential.size(),
           out.data());
  }
  return out;
}

bool HashesEqual(const KeyHash& a, const KeyHash& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> NewTenantKey(absl::string_view tenant_id) {
  absl::StatusOr<std::string> secret = RandomToken(kSecretBytes);
  if (!secret.ok()) return secret.status();
  return absl::StrCat(kTenantKeyPrefix, tenant_id, ".", *secret);
}

absl::string_view TenantIdOfKey(absl::string_view key) {
  if (key.substr(0, kTenantKeyPrefix.size()) != kTenantKeyPrefix) return {};
  key.remove_prefix(kTenantKeyPrefix.size());
  size_t dot = key.find('.');
  if (dot == absl::string_view::npos || dot == 0) return {};
  return key.substr(0, dot);
}

std::string HexOf(const KeyHash& hash) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(hash.data()), hash.size()));
}

}  // namespace tessera
