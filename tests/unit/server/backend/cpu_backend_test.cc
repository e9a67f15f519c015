#include "server/backend/cpu/cpu_backend.h"

#include <cstring>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "gtest/gtest.h"

namespace tessera {
namespace {

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<TenantContext> Context() {
    Quota quota{.device_memory_bytes = 256 << 20,
                .compute_share_percent = 10,
                .max_streams = 1,
                .max_queued_jobs = 8,
                .priority = Priority::kNormal};
    auto context = backend_.CreateContext({"t", quota, 0});
    EXPECT_TRUE(context.ok()) << context.status();
    return *std::move(context);
  }

  CpuBackend backend_{{.memory_bytes = uint64_t{1} << 30, .worker_threads = 1, .reason = "test"}};
};

// Sizes on both sides of the 2 MiB huge-page mapping threshold, odd ones included.
TEST_F(CpuBackendTest, BuffersOfEverySizeStartZeroAndHoldTheirBytes) {
  auto context = Context();
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{4097}, (uint64_t{2} << 20) - 1,
                        uint64_t{2} << 20, (uint64_t{3} << 20) + 5, uint64_t{64} << 20}) {
    SCOPED_TRACE(size);
    auto buffer = context->Allocate(size);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ((*buffer)->size(), size);
    std::string all(size, '\x7f');
    ASSERT_TRUE(context->CopyOut(**buffer, 0, all.data(), size).ok());
    EXPECT_EQ(all, std::string(size, '\0'));
    if (size == 0) continue;
    std::string pattern(size, '\0');
    for (uint64_t i = 0; i < size; ++i) pattern[i] = static_cast<char>(i * 31 + 7);
    ASSERT_TRUE(context->CopyIn(**buffer, 0, pattern.data(), size).ok());
    std::string back(size, '\0');
    ASSERT_TRUE(context->CopyOut(**buffer, 0, back.data(), size).ok());
    EXPECT_EQ(back, pattern);
  }
}

// A freed large buffer's mapping serves the next buffer of its size whose caller writes it
// whole, without faulting fresh pages; a zero-filled buffer never gets one (it would show the
// previous owner's bytes).
TEST_F(CpuBackendTest, FreedMappingsServeOverwritesAndNeverZeroFilledBuffers) {
  auto context = Context();
  const uint64_t size = (uint64_t{4} << 20) + 3;
  const std::string pattern(size, '\x5c');
  void* first = nullptr;
  {
    auto buffer = context->AllocateForOverwrite(size);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    first = static_cast<HostBuffer&>(**buffer).data();
    ASSERT_TRUE(context->CopyIn(**buffer, 0, pattern.data(), size).ok());
  }
  void* second = nullptr;
  {
    auto zeroed = context->Allocate(size);
    ASSERT_TRUE(zeroed.ok()) << zeroed.status();
    second = static_cast<HostBuffer&>(**zeroed).data();
    EXPECT_NE(second, first);
    std::string all(size, '\x7f');
    ASSERT_TRUE(context->CopyOut(**zeroed, 0, all.data(), size).ok());
    EXPECT_EQ(all, std::string(size, '\0'));
  }
  // Newest first: the zero-filled buffer's mapping, then the first one.
  auto reused = context->AllocateForOverwrite(size);
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_EQ((*reused)->size(), size);
  EXPECT_EQ(static_cast<HostBuffer&>(**reused).data(), second);
  auto again = context->AllocateForOverwrite(size);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(static_cast<HostBuffer&>(**again).data(), first);
  auto fresh = context->AllocateForOverwrite(size);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(static_cast<HostBuffer&>(**fresh).data(), first);
  EXPECT_NE(static_cast<HostBuffer&>(**fresh).data(), second);
  // Small buffers come from malloc and hold what they are given.
  auto small = context->AllocateForOverwrite(100);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(context->CopyIn(**small, 0, pattern.data(), 100).ok());
  std::string back(100, '\0');
  ASSERT_TRUE(context->CopyOut(**small, 0, back.data(), 100).ok());
  EXPECT_EQ(back, pattern.substr(0, 100));
}

// The cache keeps at most its cap, newest mappings first out to Take, oldest first evicted;
// a mapping above the cap is unmapped at once.
TEST(HostMappingCacheTest, KeepsAtMostItsCapOldestEvictedFirst) {
  constexpr uint64_t kPage = HostBuffer::kHugePage;
  auto map = [](uint64_t length) {
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    static_cast<char*>(p)[0] = 1;
    return p;
  };
  HostMappingCache cache(2 * kPage);
  void* a = map(kPage);
  void* b = map(kPage);
  void* c = map(kPage);
  cache.Put(a, kPage);
  cache.Put(b, kPage);
  EXPECT_EQ(cache.kept_bytes(), 2 * kPage);
  cache.Put(c, kPage);  // evicts a
  EXPECT_EQ(cache.kept_bytes(), 2 * kPage);
  EXPECT_EQ(cache.Take(2 * kPage), nullptr);  // lengths must match
  EXPECT_EQ(cache.Take(kPage), c);
  EXPECT_EQ(cache.Take(kPage), b);
  EXPECT_EQ(cache.Take(kPage), nullptr);
  EXPECT_EQ(cache.reuses(), 2u);
  EXPECT_EQ(cache.kept_bytes(), 0u);
  cache.Put(map(4 * kPage), 4 * kPage);  // above the cap: unmapped, not kept
  EXPECT_EQ(cache.kept_bytes(), 0u);
  // A taken mapping is the caller's: writable, and its bytes are written whole before use.
  std::memset(b, 0x33, kPage);
  std::memset(c, 0x44, kPage);
  munmap(b, kPage);
  munmap(c, kPage);
}

}  // namespace
}  // namespace tessera
