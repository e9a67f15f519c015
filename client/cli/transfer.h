// Tensor transfers between a file descriptor and the server, for `tessera tensor put` and
// `tessera tensor get`: streamed (one chunk in memory at a time, each byte copied once on this
// side), or through a shared-memory region of the client's when it is connected to the
// server's Unix socket (the file read into the region, or written from it: no other copy).
// Main thread only (as Session).
#ifndef TESSERA_CLIENT_CLI_TRANSFER_H_
#define TESSERA_CLIENT_CLI_TRANSFER_H_

#include <cstddef>
#include <optional>
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

/// UploadFrom through a region (Client::LeaseTransferRegion): the data read straight into it
/// (`chunk_bytes` at a time, for the progress bar), then one WriteTensorFromRegion. The same
/// local errors, found before anything is sent. nullopt when the client moves no bytes through
/// regions (then stream with UploadFrom).
std::optional<Transfer> UploadThroughRegion(Session& s, const NpyHeader& header, int fd,
                                            const std::string& name, size_t chunk_bytes);

/// DownloadTo through a region: ReadTensorIntoRegion, then the .npy header and the bytes
/// written to `fd` from the region. nullopt when the client moves no bytes through regions.
std::optional<Transfer> DownloadThroughRegion(Session& s, const std::string& handle, int fd,
                                              const std::string& name);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_TRANSFER_H_
