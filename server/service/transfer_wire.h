#ifndef TESSERA_SERVER_SERVICE_TRANSFER_WIRE_H_
#define TESSERA_SERVER_SERVICE_TRANSFER_WIRE_H_

// The wire form of the streamed transfers' bulk messages, read and written by hand so that a
// chunk's bytes are copied once between gRPC's slices and the tensor (transfer_reactors.h):
// a WriteTensorRequest's chunk is found where it lies in the received slices, and a
// ReadTensorResponse goes out as a small encoded prefix followed by a slice of the chunk's
// bytes. Everything else (headers, other field orders, unknown fields) is protobuf's.
//
// Pure functions over gRPC byte buffers: no locks, any thread.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

#include "tessera/v1/compute.pb.h"

namespace tessera {

/// A WriteTensorRequest's `chunk` found in a received message: its `offset` and the bytes of
/// its `data` where they lie in the message's slices, which the view holds (`pieces` point
/// into them: the view is neither copied nor moved).
struct ChunkView {
  ChunkView() = default;
  ChunkView(const ChunkView&) = delete;
  ChunkView& operator=(const ChunkView&) = delete;

  uint64_t offset = 0;
  uint64_t size = 0;                      // bytes in `pieces`, together
  std::vector<absl::string_view> pieces;  // `data`, in order
  std::vector<grpc::Slice> slices;        // the message's, referenced
};

/// Fills `chunk` when `message` is exactly `chunk { offset data }` in field order (`offset`
/// may be absent: 0), the form protobuf writes and every client sends, and returns true.
/// False for any other form (a header, unknown or repeated fields, another order): the caller
/// parses the message with protobuf, which reads them all. INVALID_ARGUMENT naming the field
/// for bytes that cannot be a message at all (a length past the message's end, a varint that
/// does not end).
absl::StatusOr<bool> FindChunk(const grpc::ByteBuffer& message, ChunkView* chunk);

/// Parses `message` into `proto` (an invalid, i.e. empty, buffer is the empty message);
/// false when the bytes are not a `proto`.
bool ParseMessage(const grpc::ByteBuffer& message, google::protobuf::MessageLite* proto);

/// `proto` serialized into `buffer`.
void SerializeMessage(const google::protobuf::MessageLite& proto, grpc::ByteBuffer* buffer);

/// The bytes of a ReadTensorResponse that come before its chunk's data: `info` (the first
/// reply's; nullptr for the others), then `chunk` with `offset` and `data_bytes` of data,
/// which the caller sends right after (as protobuf writes the message).
std::string ReadReplyPrefix(const v1::TensorInfo* info, uint64_t offset, uint64_t data_bytes);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_TRANSFER_WIRE_H_
