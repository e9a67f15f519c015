// The CUDA backend's registered host ranges (TenantContext::RegisterHost, the device side of a
// tenant's shared-memory region) on the fake driver: a copy inside a registered range is one
// DMA from or to the caller's memory with no staging copy (the fake counts copies by host
// memory), anything else is staged as before, a registration's end unpins its range, a
// context rebuilt after a fault pins it again, and the driver's refusals map to statuses.
// Every test ends with no driver misuse and nothing left on the device.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cuda.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "kernels/registry.h"
#include "server/backend/select.h"
#include "server/common/shared_memory.h"
#include "tests/fake_cuda/driver/fake_cuda.h"
#include "tests/testing/context_runner.h"
#include "tests/testing/region_handover.h"

namespace tessera {
namespace {

using testing::FakeCudaKind;
using ::testing::HasSubstr;

/// `size` bytes mapped as the server maps a region: a memfd sealed against shrinking,
/// mapped MAP_SHARED by SharedMemory. Null on failure.
std::unique_ptr<SharedMemory> MapRegion(uint64_t size) {
  const int fd = testing::MakeMemfd(size);
  if (fd < 0) return nullptr;
  absl::StatusOr<std::unique_ptr<SharedMemory>> memory = SharedMemory::Map(fd, size);
  EXPECT_TRUE(memory.ok()) << memory.status();
  return memory.ok() ? *std::move(memory) : nullptr;
}

class FakeCudaRegionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/tessera-no-mps", 1);
    if (auto loaded = testing::FakeCudaDriver::Loaded()) loaded->Reset();
    absl::StatusOr<BackendChoice> choice = SelectBackend({.backend = "cuda", .mps = "auto"});
    ASSERT_TRUE(choice.ok()) << choice.status();
    backend_ = std::move(choice->backend);
    fake_ = testing::FakeCudaDriver::Loaded();
    ASSERT_TRUE(fake_.has_value()) << "libcuda.so.1 is not the fake driver";
    auto context = backend_->CreateContext({"regions", testing::TestQuota(25, 1), 0});
    ASSERT_TRUE(context.ok()) << context.status();
    context_ = *std::move(context);
  }

  // After the backend (and every context): no misuse, no leak.
  void TearDown() override {
    context_.reset();
    backend_.reset();
    if (!fake_) return;
    EXPECT_EQ(fake_->misuses(), 0) << "driver API misuse (see stderr)";
    std::string report;
    EXPECT_EQ(fake_->Leaks(&report), 0) << "driver objects the backend did not give back:\n"
                                        << report;
  }

  std::unique_ptr<TenantContext::HostRegistration> Register(char* base, uint64_t bytes) {
    auto registration = context_->RegisterHost(base, bytes);
    EXPECT_TRUE(registration.ok()) << registration.status();
    EXPECT_TRUE(registration.ok() && *registration != nullptr);
    return registration.ok() ? *std::move(registration) : nullptr;
  }

  std::shared_ptr<DeviceBuffer> Allocate(uint64_t bytes) {
    auto buffer = context_->Allocate(bytes);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return buffer.ok() ? *std::move(buffer) : nullptr;
  }

  long Staged() const {
    const testing::FakeCudaHostCopies c = fake_->host_copies();
    return c.staging_in.copies + c.staging_out.copies;
  }

  long Direct() const {
    const testing::FakeCudaHostCopies c = fake_->host_copies();
    return c.direct_in.copies + c.direct_out.copies;
  }

  std::unique_ptr<Backend> backend_;
  std::optional<testing::FakeCudaDriver> fake_;
  std::unique_ptr<TenantContext> context_;
};

void Fill(char* p, size_t n, int seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>((i * 131 + seed) % 251);
}

TEST_F(FakeCudaRegionsTest, ACopyInsideARegisteredRangeIsOneDmaWithNoStagingCopy) {
  constexpr uint64_t kRegion = 1 << 20, kBytes = 3 * 4096 + 100;
  auto region = MapRegion(kRegion);
  ASSERT_NE(region, nullptr);
  auto registration = Register(region->data(), kRegion);
  ASSERT_NE(registration, nullptr);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 1);
  auto buffer = Allocate(kBytes);
  ASSERT_NE(buffer, nullptr);

  Fill(region->data() + 4096, kBytes, 1);
  ASSERT_TRUE(context_->CopyIn(*buffer, 0, region->data() + 4096, kBytes).ok());
  // Out into the region's last bytes: the range may end exactly where the region does.
  char* out = region->data() + kRegion - kBytes;
  ASSERT_TRUE(context_->CopyOut(*buffer, 0, out, kBytes).ok());
  EXPECT_EQ(std::memcmp(out, region->data() + 4096, kBytes), 0);
  // Part of the buffer, at an offset.
  ASSERT_TRUE(context_->CopyOut(*buffer, 4096, out, 100).ok());
  EXPECT_EQ(std::memcmp(out, region->data() + 4096 + 4096, 100), 0);

  const testing::FakeCudaHostCopies copies = fake_->host_copies();
  EXPECT_EQ(copies.direct_in.copies, 1);
  EXPECT_EQ(copies.direct_in.bytes, static_cast<long long>(kBytes));
  EXPECT_EQ(copies.direct_out.copies, 2);
  EXPECT_EQ(copies.direct_out.bytes, static_cast<long long>(kBytes + 100));
  EXPECT_EQ(Staged(), 0);
  EXPECT_EQ(copies.pageable_in.copies + copies.pageable_out.copies, 0);
  // Not even the staging buffers were made.
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostMemory).created, 0);

  // Its end unpins the range; the same memory is then staged.
  registration.reset();
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 0);
  ASSERT_TRUE(context_->CopyIn(*buffer, 0, region->data(), kBytes).ok());
  EXPECT_EQ(fake_->host_copies().staging_in.copies, 1);
  EXPECT_EQ(Direct(), 3);
}

TEST_F(FakeCudaRegionsTest, CopiesNotWhollyInsideARegisteredRangeAreStaged) {
  constexpr uint64_t kRegion = 64 * 1024, kBytes = 8192;
  // Only the middle of the mapping is registered.
  auto mapping = MapRegion(3 * kRegion);
  ASSERT_NE(mapping, nullptr);
  char* region = mapping->data() + kRegion;
  auto registration = Register(region, kRegion);
  ASSERT_NE(registration, nullptr);
  auto buffer = Allocate(kBytes);
  ASSERT_NE(buffer, nullptr);

  // Ordinary memory.
  std::vector<char> plain(kBytes);
  Fill(plain.data(), kBytes, 2);
  ASSERT_TRUE(context_->CopyIn(*buffer, 0, plain.data(), kBytes).ok());
  // Across the registered range's end, and across its start, each way.
  char* across_end = region + kRegion - kBytes / 2;
  char* across_start = region - kBytes / 2;
  ASSERT_TRUE(context_->CopyOut(*buffer, 0, across_end, kBytes).ok());
  EXPECT_EQ(std::memcmp(across_end, plain.data(), kBytes), 0);
  ASSERT_TRUE(context_->CopyIn(*buffer, 0, across_end, kBytes).ok());
  ASSERT_TRUE(context_->CopyOut(*buffer, 0, across_start, kBytes).ok());
  EXPECT_EQ(std::memcmp(across_start, plain.data(), kBytes), 0);
  ASSERT_TRUE(context_->CopyIn(*buffer, 0, across_start, kBytes).ok());

  const testing::FakeCudaHostCopies copies = fake_->host_copies();
  EXPECT_EQ(Direct(), 0);
  EXPECT_EQ(copies.staging_in.copies, 3);
  EXPECT_EQ(copies.staging_out.copies, 2);
  EXPECT_EQ(copies.pageable_in.copies + copies.pageable_out.copies, 0);
}

TEST_F(FakeCudaRegionsTest, RegisteringARangeThatOverlapsAnotherIsRefused) {
  auto region = MapRegion(64 * 1024);
  ASSERT_NE(region, nullptr);
  auto first = Register(region->data(), 32 * 1024);
  ASSERT_NE(first, nullptr);
  auto overlapping = context_->RegisterHost(region->data() + 16 * 1024, 32 * 1024);
  EXPECT_EQ(overlapping.status().code(), absl::StatusCode::kInvalidArgument)
      << overlapping.status();
  EXPECT_THAT(overlapping.status().message(), HasSubstr("overlaps"));
  auto next = Register(region->data() + 32 * 1024, 32 * 1024);  // adjacent is fine
  EXPECT_NE(next, nullptr);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 2);
}

// The driver's refusal: out of memory (too much pinned memory) is RESOURCE_EXHAUSTED, other
// errors UNAVAILABLE, each naming the call and the size; CUDA_ERROR_NOT_SUPPORTED leaves the
// range to the staging path. The context works on.
TEST_F(FakeCudaRegionsTest, ARefusedRegistrationIsMappedToAStatusNamingTheCallAndSize) {
  auto region = MapRegion(64 * 1024);
  ASSERT_NE(region, nullptr);
  fake_->Fail("cuMemHostRegister", 0, CUDA_ERROR_OUT_OF_MEMORY);
  auto refused = context_->RegisterHost(region->data(), 65536);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("65536 bytes"));
  EXPECT_THAT(refused.status().message(), HasSubstr("cuMemHostRegister"));
  EXPECT_THAT(refused.status().message(), HasSubstr("CUDA_ERROR_OUT_OF_MEMORY"));

  fake_->Fail("cuMemHostRegister", 0, CUDA_ERROR_INVALID_VALUE);
  refused = context_->RegisterHost(region->data(), 65536);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("cuMemHostRegister"));
  EXPECT_THAT(refused.status().message(), HasSubstr("CUDA_ERROR_INVALID_VALUE"));
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).created, 0);

  fake_->Fail("cuMemHostRegister", 0, CUDA_ERROR_NOT_SUPPORTED);
  auto unsupported = context_->RegisterHost(region->data(), 65536);
  ASSERT_TRUE(unsupported.ok()) << unsupported.status();
  EXPECT_EQ(*unsupported, nullptr);
  auto buffer = Allocate(4096);
  ASSERT_NE(buffer, nullptr);
  ASSERT_TRUE(context_->CopyIn(*buffer, 0, region->data(), 4096).ok());
  EXPECT_EQ(Direct(), 0);
  EXPECT_EQ(Staged(), 1);

  // Registering works once the driver agrees.
  auto registration = Register(region->data(), 65536);
  ASSERT_NE(registration, nullptr);
  ASSERT_TRUE(context_->CopyIn(*buffer, 0, region->data(), 4096).ok());
  EXPECT_EQ(Direct(), 1);
}

// A rebuilt context pins a range registered in the faulted one again at its first copy from
// it (once: if the driver refuses, the range is staged in that context).
TEST_F(FakeCudaRegionsTest, AContextRebuiltAfterAFaultPinsTheRangeAgain) {
  constexpr uint64_t kRegion = 64 * 1024;
  auto region = MapRegion(kRegion);
  ASSERT_NE(region, nullptr);
  auto registration = Register(region->data(), kRegion);
  ASSERT_NE(registration, nullptr);
  auto fill = *kernels::Registry::Global().Prepare(
      "fill", {}, {{"value", 3.0}, {"shape", std::vector<int64_t>{1024}}});
  auto lost = Allocate(4096);
  ASSERT_NE(lost, nullptr);
  fake_->Fail("cuEventRecord", 1, CUDA_ERROR_ECC_UNCORRECTABLE);  // the job's end
  absl::Status failed = testing::RunSteps(*context_, {Step{fill, {}, {lost}}});
  ASSERT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  ASSERT_TRUE(lost->lost());
  lost.reset();
  // The pin went with the faulted context.
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).freed_after_fault, 1);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 0);

  auto buffer = Allocate(4096);  // rebuilds the context
  ASSERT_NE(buffer, nullptr);
  ASSERT_TRUE(testing::RunSteps(*context_, {Step{fill, {}, {buffer}}}).ok());
  ASSERT_TRUE(context_->CopyOut(*buffer, 0, region->data(), 4096).ok());
  float value = 0;
  std::memcpy(&value, region->data() + 4092, 4);
  EXPECT_EQ(value, 3.0f);
  EXPECT_EQ(Direct(), 1);
  EXPECT_EQ(Staged(), 0);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 1);
  registration.reset();
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 0);

  // Again, with the driver refusing to pin it in the next context.
  registration = Register(region->data(), kRegion);
  ASSERT_NE(registration, nullptr);
  fake_->Fail("cuEventRecord", 1, CUDA_ERROR_ECC_UNCORRECTABLE);  // the job's end
  ASSERT_EQ(testing::RunSteps(*context_, {Step{fill, {}, {buffer}}}).code(),
            absl::StatusCode::kUnavailable);
  buffer = Allocate(4096);
  ASSERT_NE(buffer, nullptr);
  const long created = fake_->tally(FakeCudaKind::kHostRegistration).created;
  fake_->Fail("cuMemHostRegister", 0, CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_TRUE(context_->CopyIn(*buffer, 0, region->data(), 4096).ok());
  ASSERT_TRUE(context_->CopyOut(*buffer, 0, region->data(), 4096).ok());
  EXPECT_EQ(Direct(), 1);
  EXPECT_EQ(Staged(), 2);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).created, created);  // tried once
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 0);
}

// backend.h: registrations go before their context. A caller that gets it wrong does not
// crash the server, and the range is still unpinned (by the context, which says so in the
// log); the registration's own end is then a no-op.
TEST_F(FakeCudaRegionsTest, AContextDestroyedBeforeItsRegistrationUnpinsTheRange) {
  auto region = MapRegion(64 * 1024);
  ASSERT_NE(region, nullptr);
  auto registration = Register(region->data(), 64 * 1024);
  ASSERT_NE(registration, nullptr);
  context_.reset();
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 0);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).freed_with_context, 0);
  registration.reset();
  EXPECT_EQ(fake_->misuses(), 0);
}

}  // namespace
}  // namespace tessera
