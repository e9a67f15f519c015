#include "server/core/request_gate.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/common/telemetry.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(RequestGateTest, BoundsTheCallsInFlightAndFreesASlotWhenATicketGoes) {
  RequestGate gate(/*max_in_flight=*/2, /*rate=*/1000, /*burst=*/1000);
  const absl::Duration t = absl::Seconds(10);
  auto first = gate.Begin(t);
  auto second = gate.Begin(t);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(gate.in_flight(), 2u);
  absl::Status third = gate.Begin(t).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(), HasSubstr("quota.max_requests_in_flight"));
  EXPECT_THAT(third.message(), HasSubstr("2 requests in flight"));
  EXPECT_EQ(telemetry::RefusalReason(third), "requests_in_flight");
  EXPECT_GT(telemetry::RetryAfterMs(third), 0);
  first->reset();
  EXPECT_EQ(gate.in_flight(), 1u);
  EXPECT_TRUE(gate.Begin(t).ok());  // a ticket destroyed at once frees its slot again
  EXPECT_EQ(gate.in_flight(), 1u);
  const RequestGate::Counts counts = gate.counts();
  EXPECT_EQ(counts.in_flight, 1u);
  EXPECT_EQ(counts.refused_in_flight, 1u);
  EXPECT_EQ(counts.refused_rate, 0u);
}

TEST(RequestGateTest, ATokenBucketLimitsTheRateAndSaysWhenToRetry) {
  RequestGate gate(/*max_in_flight=*/100, /*rate=*/10, /*burst=*/5);
  absl::Duration t = absl::Seconds(1);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(gate.Begin(t).ok()) << i;  // the burst
  absl::Status refused = gate.Begin(t).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("quota.requests_per_second (10 per second"));
  EXPECT_EQ(telemetry::RefusalReason(refused), "request_rate");
  EXPECT_EQ(telemetry::RetryAfterMs(refused), 100);  // one token at 10 per second
  EXPECT_EQ(gate.counts().refused_rate, 1u);
  EXPECT_EQ(gate.counts().refused_in_flight, 0u);
  t += absl::Milliseconds(100);
  EXPECT_TRUE(gate.Begin(t).ok());
  EXPECT_FALSE(gate.Begin(t).ok());
  // Over a long idle time the bucket fills to its size, never beyond.
  t += absl::Hours(1);
  int passed = 0;
  while (gate.Begin(t).ok()) ++passed;
  EXPECT_EQ(passed, 5);
}

TEST(RequestGateTest, SustainedRateMatchesTheQuota) {
  RequestGate gate(/*max_in_flight=*/1000, /*rate=*/200, /*burst=*/20);
  int passed = 0;
  // 10 simulated seconds, a call attempt every millisecond.
  for (int ms = 0; ms < 10000; ++ms) passed += gate.Begin(absl::Milliseconds(ms)).ok() ? 1 : 0;
  EXPECT_NEAR(passed, 20 + 200 * 10, 5);
}

TEST(RequestGateTest, BurstIsATenthOfASecondAndAtLeastTheSlots) {
  EXPECT_EQ(RequestGate::BurstFor(64, 100000), 10000);
  EXPECT_EQ(RequestGate::BurstFor(64, 100), 64);
}

TEST(RequestGateTest, NoRetryHintOnOtherStatuses) {
  EXPECT_EQ(telemetry::RetryAfterMs(absl::ResourceExhaustedError("x")), -1);
  EXPECT_EQ(telemetry::RetryAfterMs(absl::OkStatus()), -1);
}

}  // namespace
}  // namespace tessera
