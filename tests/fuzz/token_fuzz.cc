// The credential parsers: the `authorization` metadata (server/service/auth.cc, BearerToken),
// the tenant key format (server/core/token.cc, TenantIdOfKey, NewTenantKey, HashCredential)
// and the admin token from a file or the environment (server/core/admin_token.cc,
// LoadOrCreateAdminToken). The input is all of these at once: the metadata value, the key,
// the token file's contents and the environment variable's value.
//
// Properties: a key's claimed tenant id is the text between "tsk_" and the first '.'; every
// valid tenant id gets keys that claim it; a bearer token is the metadata value after
// "Bearer " (any case), trimmed; an admin token is the file's first line (or the variable),
// trimmed, at least kMinAdminTokenLength long, and its hash is the credential's hash.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "grpc/grpc.h"
#include "grpcpp/test/server_context_test_spouse.h"

#include "server/core/admin_token.h"
#include "server/core/token.h"
#include "server/core/validation.h"
#include "server/service/auth.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void CheckTenantKey(absl::string_view key) {
  absl::string_view id = tessera::TenantIdOfKey(key);
  if (id.empty()) return;
  FUZZ_CHECK(absl::StartsWith(key, tessera::kTenantKeyPrefix), "no prefix");
  FUZZ_CHECK(key.substr(tessera::kTenantKeyPrefix.size(), id.size()) == id, "id not after prefix");
  FUZZ_CHECK(key.size() > tessera::kTenantKeyPrefix.size() + id.size() &&
                 key[tessera::kTenantKeyPrefix.size() + id.size()] == '.',
             "id not followed by '.'");
  FUZZ_CHECK(!absl::StrContains(id, '.'), "id contains '.'");

  // A key minted for a valid id claims that id.
  if (tessera::ValidateTenantId(id).ok()) {
    absl::StatusOr<std::string> minted = tessera::NewTenantKey(id);
    FUZZ_CHECK(minted.ok(), minted.status().ToString());
    FUZZ_CHECK(tessera::TenantIdOfKey(*minted) == id, "NewTenantKey(", id, ") claims ",
               tessera::TenantIdOfKey(*minted));
    FUZZ_CHECK(
        !tessera::HashesEqual(tessera::HashCredential(*minted), tessera::HashCredential(key)),
        "a fresh key hashes like the input");
  }
}

void CheckBearer(const std::string& value) {
  // gRPC stays initialized between inputs (each ServerContext would otherwise start and stop
  // the library).
  static const bool initialized = [] {
    grpc_init();
    return true;
  }();
  (void)initialized;
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  spouse.AddClientMetadata("authorization", value);
  absl::StatusOr<std::string> token = tessera::BearerToken(context);
  if (!token.ok()) {
    FUZZ_CHECK(absl::IsUnauthenticated(token.status()), token.status().ToString());
    return;
  }
  FUZZ_CHECK(absl::StartsWithIgnoreCase(value, "bearer "), "accepted without the scheme");
  FUZZ_CHECK(*token == absl::StripAsciiWhitespace(absl::string_view(value).substr(7)),
             "the token is not the trimmed rest of the value");
  const tessera::KeyHash hash = tessera::HashCredential(*token);
  FUZZ_CHECK(tessera::HashesEqual(hash, tessera::HashCredential(*token)), "hash not stable");
  FUZZ_CHECK(tessera::HexOf(hash).size() == 64, "hex of a hash");
}

// A private directory for the token file, made once per process.
const std::string& TokenPath() {
  static const std::string* path = [] {
    std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    dir += "/tessera-token-fuzz-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) std::abort();
    std::atexit(
        [] { std::filesystem::remove_all(std::filesystem::path(TokenPath()).parent_path()); });
    return new std::string(dir + "/admin_token");
  }();
  return *path;
}

void CheckAdminToken(const std::string& contents) {
  // From the environment variable.
  if (!contents.empty()) {
    absl::StatusOr<tessera::AdminCredential> env =
        tessera::LoadOrCreateAdminToken(TokenPath() + ".absent", contents);
    const std::string trimmed(absl::StripAsciiWhitespace(contents));
    if (env.ok()) {
      FUZZ_CHECK(trimmed.size() >= tessera::kMinAdminTokenLength, "short token accepted");
      FUZZ_CHECK(tessera::HashesEqual(env->hash, tessera::HashCredential(trimmed)), "env hash");
    } else {
      FUZZ_CHECK(absl::IsFailedPrecondition(env.status()) &&
                     trimmed.size() < tessera::kMinAdminTokenLength,
                 env.status().ToString());
    }
  }
  // From the file (mode 0600, as the server creates it).
  int fd = open(TokenPath().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  if (write(fd, contents.data(), contents.size()) != static_cast<ssize_t>(contents.size())) {
    std::abort();
  }
  close(fd);
  absl::StatusOr<tessera::AdminCredential> file = tessera::LoadOrCreateAdminToken(TokenPath(), "");
  const std::string line(
      absl::StripAsciiWhitespace(absl::string_view(contents).substr(0, contents.find('\n'))));
  if (file.ok()) {
    FUZZ_CHECK(!file->created, "an existing token file was created");
    FUZZ_CHECK(line.size() >= tessera::kMinAdminTokenLength, "short token accepted");
    FUZZ_CHECK(tessera::HashesEqual(file->hash, tessera::HashCredential(line)),
               "the hash is not the first line's");
  } else {
    FUZZ_CHECK(absl::IsFailedPrecondition(file.status()), file.status().ToString());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  CheckTenantKey(input);
  CheckBearer(input);
  CheckAdminToken(input);
  return 0;
}
