#ifndef TESSERA_SERVER_COMMON_SHARED_MEMORY_H_
#define TESSERA_SERVER_COMMON_SHARED_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace tessera {

/// Largest region one descriptor may map (also bounded by the tenant's max_region_bytes).
inline constexpr uint64_t kMaxRegionSizeBytes = uint64_t{1} << 40;  // 1 TiB

/// A client's memfd mapped read-write into this process (MAP_SHARED): the bytes of a
/// shared-memory region. Unmapped when destroyed; the descriptor itself is closed as soon as
/// the mapping exists, so a region holds no file descriptor.
///
/// Only a memfd sealed against shrinking (F_SEAL_SHRINK) is accepted: its owner cannot
/// truncate it under the mapping, so no access inside [data, data + size) can raise SIGBUS.
/// Thread-safe to read and write through data() from any thread (the bytes are the client's:
/// they may change at any time, and callers treat them as untrusted).
class SharedMemory {
 public:
  /// Takes ownership of `fd` (closed on every path) and maps its first `size` bytes.
  /// INVALID_ARGUMENT, naming the reason, for: a descriptor that is not a memfd (a regular or
  /// tmpfs file, a pipe, a socket, a device such as /dev/zero), a memfd without F_SEAL_SHRINK,
  /// one holding fewer than `size` bytes, one that is not writable (opened read-only or
  /// sealed against writes), `size` 0 or above kMaxRegionSizeBytes.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Map(int fd, uint64_t size);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  SharedMemory(char* data, uint64_t size) : data_(data), size_(size) {}
  char* const data_;
  const uint64_t size_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMON_SHARED_MEMORY_H_
