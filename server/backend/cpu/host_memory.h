#ifndef TESSERA_SERVER_BACKEND_CPU_HOST_MEMORY_H_
#define TESSERA_SERVER_BACKEND_CPU_HOST_MEMORY_H_

#include <cstdint>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

#include "server/backend/backend.h"

namespace tessera {

/// Large host mappings freed by the CPU backend's buffers, kept for the next buffer of the
/// same size whose every byte its caller writes before anything reads it (an upload's new
/// tensor, an in-place step's temporary). Such a buffer then costs no page faults and no
/// kernel zero-filling (measured: a fresh 256 MiB tensor's faults were a third of an upload's
/// server time). Kept mappings are advised MADV_FREE, so under memory pressure the kernel
/// reclaims their pages instead of swapping; a reclaimed page faults in zeroed again.
///
/// At most `cap_bytes` are kept; the oldest go first. Thread-safe.
class HostMappingCache {
 public:
  explicit HostMappingCache(uint64_t cap_bytes) : cap_(cap_bytes) {}
  ~HostMappingCache();  ///< unmaps what it keeps
  HostMappingCache(const HostMappingCache&) = delete;
  HostMappingCache& operator=(const HostMappingCache&) = delete;

  /// A kept mapping of exactly `length` bytes, or nullptr.
  void* Take(uint64_t length);
  /// Keeps the mapping for reuse, or unmaps it when it is larger than the cap.
  void Put(void* data, uint64_t length);

  uint64_t cap_bytes() const { return cap_; }
  uint64_t kept_bytes() const;
  /// How many Take calls returned a kept mapping.
  uint64_t reuses() const;

 private:
  struct Mapping {
    void* data;
    uint64_t length;
  };
  const uint64_t cap_;
  mutable absl::Mutex mu_;
  std::list<Mapping> kept_ ABSL_GUARDED_BY(mu_);  // oldest first
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reuses_ ABSL_GUARDED_BY(mu_) = 0;
};

/// Whether a new buffer must read as zero or its caller overwrites every byte first.
enum class HostFill { kZero, kCallerWritesAll };

/// Host memory for one buffer. From 2 MiB on, a buffer is its own 2 MiB-aligned mapping
/// advised for transparent huge pages (a 64 MiB upload takes 32 page faults instead of
/// 16384); freed, the mapping goes to `cache` (when given) instead of back to the kernel.
/// Only kCallerWritesAll buffers reuse a kept mapping; fresh pages read as zero, so neither
/// path zero-fills up front.
class HostBuffer final : public DeviceBuffer {
 public:
  static constexpr uint64_t kHugePage = uint64_t{2} << 20;

  static absl::StatusOr<std::shared_ptr<HostBuffer>> Create(
      uint64_t bytes, HostFill fill, std::shared_ptr<HostMappingCache> cache = nullptr);
  ~HostBuffer() override;

  uint64_t size() const override { return size_; }
  void* data() const { return data_; }
  const void* host_data() const override { return data_; }

 private:
  HostBuffer(void* data, uint64_t size, uint64_t mapped, std::shared_ptr<HostMappingCache> cache)
      : data_(data), size_(size), mapped_(mapped), cache_(std::move(cache)) {}
  void* const data_;
  const uint64_t size_;
  const uint64_t mapped_;  // > 0: an mmap of this length
  const std::shared_ptr<HostMappingCache> cache_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_CPU_HOST_MEMORY_H_
