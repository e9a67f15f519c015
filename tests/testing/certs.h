#ifndef TESSERA_TESTS_TESTING_CERTS_H_
#define TESSERA_TESTS_TESTING_CERTS_H_

// Certificates minted per test run by the openssl CLI.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "tests/testing/server_process.h"

namespace tessera::testing {

/// Writes into `dir`: ca.pem/ca.key (a CA), server.pem/server.key (for 127.0.0.1, ::1 and
/// localhost) and client.pem/client.key (a client certificate), all signed by the CA and
/// valid for one day.
inline absl::Status MintTestCertificates(const std::string& dir) {
  const std::string script = R"(set -e
cd ")" + dir + R"("
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -out ca.pem -days 1 -subj /CN=tessera-test-ca
key server.key
openssl req -new -key server.key -out server.csr -subj /CN=localhost
printf 'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile server.ext -out server.pem 2>/dev/null
key client.key
openssl req -new -key client.key -out client.csr -subj /CN=tessera-test-client
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile client.ext -out client.pem 2>/dev/null
)";
  auto result = RunCommand({"/bin/sh", "-c", script}, {});
  if (!result.ok()) return result.status();
  if (result->exit_code != 0) {
    return absl::InternalError(absl::StrCat("minting certificates failed: ", result->output));
  }
  return absl::OkStatus();
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_CERTS_H_
