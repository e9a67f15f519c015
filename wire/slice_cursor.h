#ifndef TESSERA_WIRE_SLICE_CURSOR_H_
#define TESSERA_WIRE_SLICE_CURSOR_H_

// Reading a protobuf message's wire bytes where gRPC received them (its slices), so that a
// tensor chunk's bytes are copied once, straight to where they go. Shared by the server's
// transfer reactors (server/service/transfer_wire.cc) and the C++ client's Download
// (client/client.cc): header-only, gRPC's slices and Abseil only, so that neither side
// includes the other's folder.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/support/slice.h"

namespace tessera::wire {

/// Reads a message's bytes across its slices, front to back. `slices` must outlive it and
/// hold at least `total` bytes. Not thread-safe.
class SliceCursor {
 public:
  SliceCursor(const std::vector<grpc::Slice>& slices, uint64_t total)
      : slices_(slices), left_(total) {}

  uint64_t left() const { return left_; }

  /// The next byte; false at the message's end.
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

  /// Protobuf's base-128 varint: at most 10 bytes; false when it does not end in them.
  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int i = 0; i < 10; ++i) {
      uint8_t byte = 0;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  /// The next `bytes` (at most left()) where they lie, one view per slice they span.
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

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_SLICE_CURSOR_H_
