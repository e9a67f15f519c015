#include "server/service/transfer_wire.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace tessera {
namespace {

// Tags (field number << 3 | wire type) of the fields read and written here.
constexpr uint8_t kInfoTag = (1 << 3) | 2;    // ReadTensorResponse.info, length-delimited
constexpr uint8_t kChunkTag = (2 << 3) | 2;   // WriteTensorRequest.chunk / ReadTensorResponse.chunk
constexpr uint8_t kOffsetTag = (1 << 3) | 0;  // Chunk.offset, varint
constexpr uint8_t kDataTag = (2 << 3) | 2;    // Chunk.data, length-delimited
constexpr int kMaxVarintBytes = 10;

// Reads a message's bytes across its slices, front to back.
class SliceCursor {
 public:
  SliceCursor(const std::vector<grpc::Slice>& slices, uint64_t total)
      : slices_(slices), left_(total) {}

  uint64_t left() const { return left_; }

  bool ReadByte(uint8_t* byte) {
    if (left_ == 0) return false;
    while (position_ == slices_[index_].size()) {  // empty or used up: the next one
      ++index_;
      position_ = 0;
    }
    *byte = slices_[index_].begin()[position_++];
    --left_;
    return true;
  }

  // Protobuf's base-128 varint: at most 10 bytes; false when it does not end in them.
  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int i = 0; i < kMaxVarintBytes; ++i) {
      uint8_t byte = 0;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // The next `bytes` (at most left()) where they lie, one view per slice they span.
  void Take(uint64_t bytes, std::vector<absl::string_view>* pieces) {
    left_ -= bytes;
    while (bytes > 0) {
      const grpc::Slice& slice = slices_[index_];
      const uint64_t n = std::min<uint64_t>(bytes, slice.size() - position_);
      if (n > 0) {
        pieces->emplace_back(reinterpret_cast<const char*>(slice.begin()) + position_, n);
      }
      position_ += n;
      bytes -= n;
      if (position_ == slice.size()) {
        ++index_;
        position_ = 0;
      }
    }
  }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t position_ = 0;
  uint64_t left_;
};

absl::Status Malformed(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::Status RunsPast(absl::string_view field, uint64_t length, uint64_t left) {
  return Malformed(absl::StrCat(field, "'s length (", length,
                                " bytes) runs past the message's end (", left, " bytes left)"));
}

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

uint64_t VarintBytes(uint64_t value) {
  uint64_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
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
    AppendVarint(encoded.size(), &out);
    out += encoded;
  }
  // Protobuf leaves out proto3 fields that hold their default: a zero offset, empty data.
  const uint64_t offset_field = offset == 0 ? 0 : 1 + VarintBytes(offset);
  const uint64_t data_field = data_bytes == 0 ? 0 : 1 + VarintBytes(data_bytes) + data_bytes;
  out.push_back(static_cast<char>(kChunkTag));
  AppendVarint(offset_field + data_field, &out);
  if (offset != 0) {
    out.push_back(static_cast<char>(kOffsetTag));
    AppendVarint(offset, &out);
  }
  if (data_bytes != 0) {
    out.push_back(static_cast<char>(kDataTag));
    AppendVarint(data_bytes, &out);
  }
  return out;
}

}  // namespace tessera
