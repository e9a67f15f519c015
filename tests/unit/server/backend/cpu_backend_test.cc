#include "server/backend/cpu/cpu_backend.h"

#include <cstring>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace tessera
