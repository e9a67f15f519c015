// Uses the installed client library: connects to an address where nothing listens and
// expects UNAVAILABLE, proving headers, libraries and the gRPC runtime all resolve.
#include <cstdio>

#include "tessera/client.h"

int main() {
  auto client = tessera::Client::Connect(
      {.address = "127.0.0.1:1", .token = "x", .timeout = absl::Seconds(2)});
  if (!client.ok()) return 1;
  absl::Status status = (*client)->GetServerInfo().status();
  std::printf("consumer: GetServerInfo -> %s\n", status.ToString().c_str());
  return status.code() == absl::StatusCode::kUnavailable ? 0 : 1;
}
