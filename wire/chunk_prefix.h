#ifndef TESSERA_WIRE_CHUNK_PREFIX_H_
#define TESSERA_WIRE_CHUNK_PREFIX_H_

// Writing a tensor chunk's message by hand: the encoded bytes that come before the chunk's
// data, so that the data itself goes out as a slice of its own, never copied into a message.
// WriteTensorRequest and ReadTensorResponse both carry the chunk as field 2 (`chunk`), a
// Chunk of `offset` (1) and `data` (2). Shared by the server's ReadTensor reactor
// (server/service/transfer_wire.cc) and the C++ client's upload (client/client.cc);
// header-only, so that neither side includes the other's folder.
#include <cstdint>
#include <string>

namespace tessera::wire {

// Tags: field number << 3 | wire type.
inline constexpr uint8_t kChunkTag = (2 << 3) | 2;   // WriteTensorRequest / ReadTensorResponse
inline constexpr uint8_t kOffsetTag = (1 << 3) | 0;  // Chunk.offset, varint
inline constexpr uint8_t kDataTag = (2 << 3) | 2;    // Chunk.data, length-delimited

/// Protobuf's base-128 varint of `value`, appended.
inline void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

/// How many bytes AppendVarint writes for `value`.
inline uint64_t VarintBytes(uint64_t value) {
  uint64_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

/// Appends `chunk { offset data }` up to the data's first byte, for a chunk of `data_bytes`
/// at `offset`, exactly as protobuf writes it (proto3 leaves out a zero offset and empty
/// data); the caller sends the `data_bytes` right after.
inline void AppendChunkPrefix(uint64_t offset, uint64_t data_bytes, std::string* out) {
  const uint64_t offset_field = offset == 0 ? 0 : 1 + VarintBytes(offset);
  const uint64_t data_field = data_bytes == 0 ? 0 : 1 + VarintBytes(data_bytes) + data_bytes;
  out->push_back(static_cast<char>(kChunkTag));
  AppendVarint(offset_field + data_field, out);
  if (offset != 0) {
    out->push_back(static_cast<char>(kOffsetTag));
    AppendVarint(offset, out);
  }
  if (data_bytes != 0) {
    out->push_back(static_cast<char>(kDataTag));
    AppendVarint(data_bytes, out);
  }
}

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_CHUNK_PREFIX_H_
