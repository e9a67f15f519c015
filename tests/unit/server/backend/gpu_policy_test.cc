#include "server/backend/gpu_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(GpuPolicyTest, MpsClientLimitIs48FromVoltaAnd16Before) {
  EXPECT_EQ(MpsClientContextLimit(6), 16u);  // Pascal
  EXPECT_EQ(MpsClientContextLimit(7), 48u);  // Volta
  EXPECT_EQ(MpsClientContextLimit(9), 48u);  // Hopper
}

TEST(GpuPolicyTest, SmGroupsGoToTheLeastUsedSoSharesThatFitAreDisjoint) {
  std::vector<int> users(16, 0);  // 132 SMs split into 16 groups of 8
  auto take = [&](int sms) {
    std::vector<int> picked = PickSmGroups(users, 8, sms);
    for (int g : picked) ++users[g];
    return picked;
  };
  EXPECT_EQ(take(40), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(take(40), (std::vector<int>{5, 6, 7, 8, 9}));
  EXPECT_EQ(take(24), (std::vector<int>{10, 11, 12}));
  // Overcommitted: the three free groups, then the least used from the start.
  EXPECT_EQ(take(40), (std::vector<int>{0, 1, 13, 14, 15}));
  // A context gone frees its groups for the next one.
  for (int g : {5, 6, 7, 8, 9}) --users[g];
  EXPECT_EQ(take(16), (std::vector<int>{5, 6}));
  // Never more groups than there are, never fewer than one.
  EXPECT_EQ(PickSmGroups(std::vector<int>(4, 0), 8, 1000).size(), 4u);
  EXPECT_EQ(PickSmGroups(std::vector<int>(4, 0), 8, 0).size(), 1u);
  EXPECT_TRUE(PickSmGroups({}, 8, 40).empty());
}

TEST(GpuPolicyTest, GreenSmCountMeetsTheDevicesMinimumAndAlignment) {
  // Hopper: minimum 8 SMs, multiples of 8 (132 SMs on an H100 SXM).
  EXPECT_EQ(GreenSmCount(25, 132, 8, 8), 40);   // 33 -> 40
  EXPECT_EQ(GreenSmCount(1, 132, 8, 8), 8);     // 2 -> the minimum
  EXPECT_EQ(GreenSmCount(50, 132, 8, 8), 72);   // 66 -> 72
  EXPECT_EQ(GreenSmCount(99, 132, 8, 8), 132);  // 131 -> 136, capped at the device
  // Ampere: minimum 4, multiples of 2 (108 SMs on an A100).
  EXPECT_EQ(GreenSmCount(10, 108, 4, 2), 12);  // 10.8 -> 11 -> 12
  EXPECT_EQ(GreenSmCount(1, 108, 4, 2), 4);
  // No alignment reported: the share alone.
  EXPECT_EQ(GreenSmCount(10, 108, 0, 0), 11);
  EXPECT_EQ(GreenSmCount(10, 0, 8, 8), 0);
}

// The decision table: MPS decision x green-context support x compute share.
TEST(GpuPolicyTest, MpsGivesAnAffinityLimitedClientContext) {
  for (bool green : {false, true}) {
    GreenSupport support{.available = green, .why_not = "x", .min_partition = 8, .alignment = 8};
    ContextPlan plan = PlanContext(MpsDecision::kMps, "daemon pid 42", support, 25, 132);
    EXPECT_EQ(plan.kind, ContextKind::kMps);
    EXPECT_EQ(plan.sm_count, 33);
    EXPECT_TRUE(plan.compute_share_enforced);
    EXPECT_THAT(plan.reason, HasSubstr("33 of 132 SMs"));
    EXPECT_THAT(plan.reason, HasSubstr("daemon pid 42"));
  }
}

TEST(GpuPolicyTest, WithoutMpsAGreenContextWhereSupported) {
  GreenSupport support{.available = true, .min_partition = 8, .alignment = 8};
  ContextPlan plan = PlanContext(MpsDecision::kFallback, "no daemon", support, 25, 132);
  EXPECT_EQ(plan.kind, ContextKind::kGreen);
  EXPECT_EQ(plan.sm_count, 40);
  EXPECT_TRUE(plan.compute_share_enforced);
  EXPECT_THAT(plan.reason, HasSubstr("40 of 132 SMs"));
  EXPECT_THAT(plan.reason, HasSubstr("no daemon"));
}

TEST(GpuPolicyTest, WithoutMpsOrGreenContextsTheShareIsAdvisoryAndSaysWhy) {
  GreenSupport support{.available = false, .why_not = "driver 12.2 has no green contexts"};
  ContextPlan plan = PlanContext(MpsDecision::kFallback, "--mps=off", support, 25, 132);
  EXPECT_EQ(plan.kind, ContextKind::kFallback);
  EXPECT_EQ(plan.sm_count, 0);
  EXPECT_FALSE(plan.compute_share_enforced);
  EXPECT_THAT(plan.reason, HasSubstr("advisory"));
  EXPECT_THAT(plan.reason, HasSubstr("driver 12.2 has no green contexts"));
  EXPECT_THAT(plan.reason, HasSubstr("--mps=off"));
}

TEST(GpuPolicyTest, AFullShareNeedsNoPartition) {
  for (bool green : {false, true}) {
    GreenSupport support{.available = green, .min_partition = 8, .alignment = 8};
    ContextPlan plan = PlanContext(MpsDecision::kFallback, "no daemon", support, 100, 132);
    EXPECT_EQ(plan.kind, ContextKind::kFallback);
    EXPECT_TRUE(plan.compute_share_enforced);
  }
}

TEST(GpuPolicyTest, DriverErrorsMapToStatusesAndFaultClasses) {
  // CUDA_ERROR_ILLEGAL_ADDRESS: sticky, and fatal to the process (nothing can be rebuilt).
  CudaErrorClass illegal = ClassifyCudaError(700);
  EXPECT_EQ(illegal.code, absl::StatusCode::kUnavailable);
  EXPECT_TRUE(illegal.sticky);
  EXPECT_TRUE(illegal.process_fatal);
  EXPECT_FALSE(illegal.mps_server);
  // The others NVIDIA documents as "the process must be terminated and relaunched".
  for (int code : {702, 710, 714, 715, 716, 717, 718, 719}) {
    EXPECT_TRUE(ClassifyCudaError(code).process_fatal) << code;
  }
  // CUDA_ERROR_MPS_CLIENT_TERMINATED, ECC: sticky for the context only, which is rebuilt.
  EXPECT_TRUE(ClassifyCudaError(810).sticky);
  EXPECT_FALSE(ClassifyCudaError(810).process_fatal);
  EXPECT_TRUE(ClassifyCudaError(214).sticky);
  EXPECT_FALSE(ClassifyCudaError(214).process_fatal);
  // CUDA_ERROR_MPS_SERVER_NOT_READY: retry later, re-probe MPS, nothing lost.
  CudaErrorClass not_ready = ClassifyCudaError(807);
  EXPECT_EQ(not_ready.code, absl::StatusCode::kUnavailable);
  EXPECT_TRUE(not_ready.retry);
  EXPECT_TRUE(not_ready.mps_server);
  EXPECT_FALSE(not_ready.sticky);
  // Out of memory and the MPS client limit: RESOURCE_EXHAUSTED.
  EXPECT_EQ(ClassifyCudaError(2).code, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ClassifyCudaError(808).code, absl::StatusCode::kResourceExhausted);
  // Anything unexpected is a bug.
  EXPECT_EQ(ClassifyCudaError(1).code, absl::StatusCode::kInternal);
}

TEST(GpuPolicyTest, ErrorStatusNamesTheCallTheErrorAndTheConsequence) {
  absl::Status s = CudaErrorStatus(807, "CUDA_ERROR_MPS_SERVER_NOT_READY", "MPS server not ready",
                                   "creating tenant t1's context");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("creating tenant t1's context"));
  EXPECT_THAT(s.message(), HasSubstr("CUDA_ERROR_MPS_SERVER_NOT_READY"));
  EXPECT_THAT(s.message(), HasSubstr("retry"));
  absl::Status sticky =
      CudaErrorStatus(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "illegal address", "running job j1");
  EXPECT_THAT(sticky.message(), HasSubstr("tensors are lost"));
  EXPECT_THAT(sticky.message(), HasSubstr("the server restarts"));
  absl::Status terminated = CudaErrorStatus(810, "CUDA_ERROR_MPS_CLIENT_TERMINATED",
                                            "client terminated", "running job j2");
  EXPECT_THAT(terminated.message(), HasSubstr("the context is being rebuilt"));
}

}  // namespace
}  // namespace tessera
