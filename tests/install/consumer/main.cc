// Uses the installed client library against a running server: `consumer ADDRESS TOKEN_FILE`
// calls GetServerInfo and expects OK and the version of the package it was built against,
// proving that headers, libraries, the gRPC runtime and the server all fit together.
#include <cstdio>
#include <fstream>
#include <string>

#include "tessera/client.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer ADDRESS TOKEN_FILE\n");
    return 2;
  }
  std::string token;
  if (!std::getline(std::ifstream(argv[2]), token)) {
    std::fprintf(stderr, "consumer: cannot read a token from %s\n", argv[2]);
    return 1;
  }
  auto client =
      tessera::Client::Connect({.address = argv[1], .token = token, .timeout = absl::Seconds(10)});
  if (!client.ok()) {
    std::fprintf(stderr, "consumer: Connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<tessera::v1::ServerInfo> info = (*client)->GetServerInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "consumer: GetServerInfo: %s\n", info.status().ToString().c_str());
    return 1;
  }
  std::printf("consumer: GetServerInfo -> version %s, backend %s\n", info->version().c_str(),
              info->backend().c_str());
  return info->version() == TESSERA_PACKAGE_VERSION ? 0 : 1;
}
