// Where a download's bytes go: Client::Download's string or Client::DownloadTo's caller memory,
// filled by either path (the ReadTensor stream, or one copy out of a region). Private to the
// client library (client.cc, region.cc).
#ifndef TESSERA_CLIENT_READ_SINK_H_
#define TESSERA_CLIENT_READ_SINK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "tessera/v1/compute.pb.h"

namespace tessera::client_internal {

class ReadSink {
 public:
  virtual ~ReadSink() = default;
  /// Once, before any bytes: `bytes` will come, of the tensor `info`. An error ends the
  /// download with it.
  virtual absl::Status Start(const v1::TensorInfo& info, uint64_t bytes) = 0;
  /// The next bytes, in order; never more than Start announced, in all.
  virtual void Append(absl::string_view piece) = 0;
};

}  // namespace tessera::client_internal

#endif  // TESSERA_CLIENT_READ_SINK_H_
