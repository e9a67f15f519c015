// In-process timing of the C++ client library's transfers: tessera::Client::Upload and
// Download of an N MiB f32 tensor against a running server, for the Python client's baseline
// (client/python/benchmarks/transfer_bench.py runs this against the same server). Streamed over
// TCP; with TESSERA_ADDR=unix:PATH (the server's --unix_socket) through a shared-memory region,
// unless TESSERA_REGIONS=off.
// Usage: TESSERA_ADDR=host:port|unix:PATH TESSERA_TOKEN=key [TESSERA_REGIONS=off]
//        tessera_transfer_bench [mib] [reps] [chunk_kib]
// chunk_kib 0 (the default): the library's own chunk sizes (Upload's 1 MiB, the server's
// default for Download), as a user's call gets them.
// Prints one line per repetition: "upload_s download_s"; on stderr, at the end, how the bytes
// moved ("through a region" or "streamed").
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tessera/client.h"

int main(int argc, char** argv) {
  const char* addr = std::getenv("TESSERA_ADDR");
  const char* token = std::getenv("TESSERA_TOKEN");
  if (addr == nullptr || token == nullptr) {
    std::fprintf(stderr, "set TESSERA_ADDR and TESSERA_TOKEN\n");
    return 2;
  }
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const size_t chunk = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0) << 10;
  const char* regions = std::getenv("TESSERA_REGIONS");
  auto client = tessera::Client::Connect(
      {.address = addr,
       .token = token,
       .timeout = absl::Seconds(600),
       .use_regions = regions == nullptr || std::string(regions) != "off"});
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  std::string data(mib << 20, '\0');
  for (size_t i = 0; i < data.size(); i += 4) {
    float v = static_cast<float>(i % 65521) * 0.5f;
    std::memcpy(&data[i], &v, 4);
  }
  tessera::v1::TensorSpec spec;
  spec.set_dtype(tessera::v1::DTYPE_F32);
  spec.add_shape(static_cast<int64_t>(data.size() / 4));
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    auto info = chunk == 0 ? (*client)->Upload(spec, data) : (*client)->Upload(spec, data, chunk);
    auto t1 = std::chrono::steady_clock::now();
    if (!info.ok()) {
      std::fprintf(stderr, "upload: %s\n", info.status().ToString().c_str());
      return 1;
    }
    auto bytes = (*client)->Download(info->handle(), 0, 0, static_cast<uint32_t>(chunk));
    auto t2 = std::chrono::steady_clock::now();
    if (!bytes.ok() || *bytes != data) {
      std::fprintf(stderr, "download: %s\n",
                   bytes.ok() ? "bytes differ" : bytes.status().ToString().c_str());
      return 1;
    }
    (void)(*client)->DeleteTensor(info->handle());
    std::printf("%.6f %.6f\n", std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(t2 - t1).count());
    std::fflush(stdout);
  }
  // The client keeps its region until it is destroyed: one is registered now if it used one.
  auto listed = (*client)->ListRegions();
  std::fprintf(stderr, "%s\n",
               !(*client)->unix_socket_path().empty() && listed.ok() && listed->regions_size() > 0
                   ? "through a region"
                   : "streamed");
  return 0;
}
