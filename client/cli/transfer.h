// Streamed tensor transfers between a file descriptor and the server, for `tessera tensor put`
// and `tessera tensor get`: one chunk in memory at a time, each byte copied once on this side.
// Main thread only (as Session).
#ifndef TESSERA_CLIENT_CLI_TRANSFER_H_
#define TESSERA_CLIENT_CLI_TRANSFER_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

#include "client/cli/session.h"
#include "tessera/npy.h"
#include "tessera/v1/compute.pb.h"

namespace tessera::cli {

/// How a transfer ended. `local_error` (what was wrong with the input or the output) cancels
/// the call, so when it is set `status` is the cancellation, not the server's verdict.
struct Transfer {
  std::string local_error;
  absl::Status status;
  v1::TensorInfo info;
};

/// Streams the data that follows `header` on `fd` into a new tensor (WriteTensor), reading
/// each chunk of `chunk_bytes` straight into the message that carries it. The tensor is
/// created only if every byte arrives: a stream that ends early or runs past the data is a
/// local error (named after `name`) and cancels the call, which creates nothing.
Transfer UploadFrom(Session& s, const NpyHeader& header, int fd, const std::string& name,
                    size_t chunk_bytes);

/// Streams tensor `handle` (ReadTensor, chunks of `chunk_bytes`) into `fd` as .npy: the
/// header from the TensorInfo in the first message, then each chunk as it arrives. A write
/// error on `fd` (named `name`) or a dtype without a .npy equivalent is a local error.
Transfer DownloadTo(Session& s, const std::string& handle, size_t chunk_bytes, int fd,
                    const std::string& name);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_TRANSFER_H_
