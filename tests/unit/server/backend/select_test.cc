#include "server/backend/select.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/cpu/cpu_backend.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(SelectBackendTest, CpuWhenAskedWithTheConfiguredCapacity) {
  auto choice = SelectBackend(
      {.backend = "cpu", .mps = "auto", .cpu_memory_bytes = 3 * kGiB, .cpu_threads = 5});
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->backend->name(), "cpu");
  EXPECT_EQ(choice->reason, "--backend=cpu");
  ASSERT_EQ(choice->backend->devices().size(), 1u);
  EXPECT_EQ(choice->backend->devices()[0].memory_bytes, 3 * kGiB);
  EXPECT_EQ(choice->backend->devices()[0].compute_units, 5u);
  EXPECT_EQ(choice->backend->mps().decision, MpsDecision::kNotApplicable);
}

TEST(SelectBackendTest, DefaultCapacityIsHalfOfPhysicalMemory) {
  auto choice = SelectBackend({.backend = "cpu"});
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->backend->devices()[0].memory_bytes, PhysicalMemoryBytes() / 2);
  EXPECT_GT(choice->backend->devices()[0].compute_units, 0u);
}

TEST(SelectBackendTest, AutoFallsBackToCpuAndSaysWhy) {
  auto choice = SelectBackend({.backend = "auto"});
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->backend->name(), "cpu");
  EXPECT_THAT(choice->reason, HasSubstr("--backend=auto: "));
}

TEST(SelectBackendTest, CudaWithoutACudaBackendIsAStartupError) {
  absl::Status s = SelectBackend({.backend = "cuda"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--backend=cuda"));
}

TEST(SelectBackendTest, MpsRequireWithoutMpsIsAStartupError) {
  absl::Status s = SelectBackend({.backend = "cpu", .mps = "require"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--mps=require"));
  EXPECT_TRUE(SelectBackend({.backend = "cpu", .mps = "off"}).ok());
}

TEST(SelectBackendTest, UnknownValuesNameTheFlag) {
  EXPECT_THAT(SelectBackend({.backend = "tpu"}).status().message(), HasSubstr("--backend=tpu"));
  EXPECT_THAT(SelectBackend({.mps = "maybe"}).status().message(), HasSubstr("--mps=maybe"));
}

}  // namespace
}  // namespace tessera
