#include "server/service/transfer_wire.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"

#include "wire/chunk_prefix.h"
#include "wire/slice_cursor.h"

namespace tessera {
namespace {

// Tags (field number << 3 | wire type) of the fields read and written here.
constexpr uint8_t kInfoTag = (1 << 3) | 2;  // ReadTensorResponse.info, length-delimited
using wire::kChunkTag;
using wire::kDataTag;
using wire::kOffsetTag;

using wire::SliceCursor;

absl::Status Malformed(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::Status RunsPast(absl::string_view field, uint64_t length, uint64_t left) {
  return Malformed(absl::StrCat(field, "'s length (", length,
                                " bytes) runs past the message's end (", left, " bytes left)"));
}

}  // namespace

absl::StatusOr<bool> FindChunk(const grpc::ByteBuffer& message, ChunkView* chunk) {
  if (!message.Valid() || !message.Dump(&chunk->slices).ok()) return false;
  SliceCursor in(chunk->slices, message.Length());
  uint8_t tag = 0;
  if (!in.ReadByte(&tag) || tag != kChunkTag) return false;
  uint64_t length = 0;
  if (!in.ReadVarint(&length)) return Malformed("chunk's length is a varint that does not end");
  if (length > in.left()) return RunsPast("chunk", length, in.left());
  if (length != in.left()) return false;  // more fields after the chunk
  bool has_offset = false;
  while (in.ReadByte(&tag)) {
    if (tag == kOffsetTag && !has_offset) {
      if (!in.ReadVarint(&chunk->offset))
        return Malformed("chunk.offset is a varint that does not end");
      has_offset = true;
      continue;
    }
    if (tag != kDataTag) return false;  // an unknown field, or a repeated offset
    uint64_t size = 0;
    if (!in.ReadVarint(&size))
      return Malformed("chunk.data's length is a varint that does not end");
    if (size > in.left()) return RunsPast("chunk.data", size, in.left());
    if (size != in.left()) return false;  // more fields after the data
    chunk->size = size;
    in.Take(size, &chunk->pieces);
    return true;
  }
  return false;  // no data: protobuf's empty bytes
}

bool ParseMessage(const grpc::ByteBuffer& message, google::protobuf::MessageLite* proto) {
  proto->Clear();
  if (!message.Valid()) return true;
  grpc::ByteBuffer bytes(message);  // the reader's own reference to the same slices
  grpc::ProtoBufferReader reader(&bytes);
  return reader.status().ok() && proto->ParseFromZeroCopyStream(&reader);
}

void SerializeMessage(const google::protobuf::MessageLite& proto, grpc::ByteBuffer* buffer) {
  grpc::Slice slice(proto.SerializeAsString());
  *buffer = grpc::ByteBuffer(&slice, 1);
}

std::string ReadReplyPrefix(const v1::TensorInfo* info, uint64_t offset, uint64_t data_bytes) {
  std::string out;
  if (info != nullptr) {
    std::string encoded = info->SerializeAsString();
    out.push_back(static_cast<char>(kInfoTag));
    wire::AppendVarint(encoded.size(), &out);
    out += encoded;
  }
  wire::AppendChunkPrefix(offset, data_bytes, &out);
  return out;
}

}  // namespace tessera
