#include "server/backend/cpu/host_memory.h"

#include <cstdlib>
#include <utility>

#include <sys/mman.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

absl::Status OutOfMemory(uint64_t bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat("host memory: cannot allocate ", bytes, " bytes"));
}

// A fresh anonymous mapping of `length` bytes (a multiple of kHugePage) starting on a huge
// page boundary, or nullptr.
void* MapAligned(uint64_t length) {
  constexpr uint64_t kAlign = HostBuffer::kHugePage;
  const uint64_t reserve = length + kAlign;  // room to align the start
  void* raw = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kAlign - 1) / kAlign * kAlign;
  if (start > base) munmap(raw, start - base);
  const uintptr_t tail = start + length, end = base + reserve;
  if (end > tail) munmap(reinterpret_cast<void*>(tail), end - tail);
  void* data = reinterpret_cast<void*>(start);
  (void)madvise(data, length, MADV_HUGEPAGE);  // advice only: ignored where THP is off
  return data;
}

}  // namespace

HostMappingCache::~HostMappingCache() {
  absl::MutexLock lock(&mu_);
  for (const Mapping& m : kept_) munmap(m.data, m.length);
}

void* HostMappingCache::Take(uint64_t length) {
  absl::MutexLock lock(&mu_);
  for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {  // newest first: warmest pages
    if (it->length != length) continue;
    void* data = it->data;
    kept_bytes_ -= length;
    kept_.erase(std::next(it).base());
    reuses_++;
    return data;
  }
  return nullptr;
}

void HostMappingCache::Put(void* data, uint64_t length) {
  if (length > cap_) {
    munmap(data, length);
    return;
  }
  // Lazily freeable: the kernel may take the pages under pressure; reused first, they are
  // written whole before anything reads them, so a reclaimed page's zeros are never seen.
  (void)madvise(data, length, MADV_FREE);
  std::list<Mapping> evicted;
  {
    absl::MutexLock lock(&mu_);
    kept_.push_back(Mapping{data, length});
    kept_bytes_ += length;
    while (kept_bytes_ > cap_) {
      kept_bytes_ -= kept_.front().length;
      evicted.splice(evicted.end(), kept_, kept_.begin());
    }
  }
  for (const Mapping& m : evicted) munmap(m.data, m.length);  // outside the lock
}

uint64_t HostMappingCache::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

uint64_t HostMappingCache::reuses() const {
  absl::MutexLock lock(&mu_);
  return reuses_;
}

absl::StatusOr<std::shared_ptr<HostBuffer>> HostBuffer::Create(
    uint64_t bytes, HostFill fill, std::shared_ptr<HostMappingCache> cache) {
  if (bytes >= kHugePage) {
    const uint64_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* data = nullptr;
    if (cache != nullptr && fill == HostFill::kCallerWritesAll) data = cache->Take(mapped);
    if (data == nullptr) data = MapAligned(mapped);
    if (data == nullptr) return OutOfMemory(bytes);
    return std::shared_ptr<HostBuffer>(new HostBuffer(data, bytes, mapped, std::move(cache)));
  }
  void* data = fill == HostFill::kZero ? std::calloc(1, bytes == 0 ? 1 : bytes)
                                       : std::malloc(bytes == 0 ? 1 : bytes);
  if (data == nullptr) return OutOfMemory(bytes);
  return std::shared_ptr<HostBuffer>(new HostBuffer(data, bytes, 0, nullptr));
}

HostBuffer::~HostBuffer() {
  if (mapped_ == 0) {
    std::free(data_);
  } else if (cache_ != nullptr) {
    cache_->Put(data_, mapped_);
  } else {
    munmap(data_, mapped_);
  }
}

}  // namespace tessera
