#include "tests/bench/loadgen.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace tessera::bench {
namespace {

TEST(LoadgenTest, ClosedLoopStopsAtMaxCallsAndCountsErrors) {
  std::atomic<int> calls{0};
  LoadResult r = RunLoad({.workers = 4, .duration = absl::Seconds(30), .max_calls = 50},
                         OnThreads([&](int worker) {
                           EXPECT_GE(worker, 0);
                           EXPECT_LT(worker, 4);
                           return calls.fetch_add(1) % 5 != 0;  // every fifth call fails
                         }));
  EXPECT_EQ(calls.load(), 50);
  EXPECT_EQ(r.Ok() + r.Errors(), 50);
  EXPECT_EQ(r.Errors(), 10);
  EXPECT_EQ(r.All().size(), 40u);
  EXPECT_GT(r.Qps(), 0);
}

TEST(LoadgenTest, ClosedLoopStopsAtTheDuration) {
  LoadResult r = RunLoad({.workers = 2, .duration = absl::Milliseconds(100)}, OnThreads([](int) {
                           std::this_thread::sleep_for(std::chrono::milliseconds(10));
                           return true;
                         }));
  // Two workers of ~10 ms calls for 100 ms: about 20; never unbounded.
  EXPECT_GE(r.Ok(), 4);
  EXPECT_LE(r.Ok(), 22);
}

TEST(LoadgenTest, OpenLoopIssuesTheScheduledArrivalsAndCountsQueueing) {
  // 200/s for 100 ms: arrivals at 0, 5, …, 95 ms = 20, served by one worker taking 8 ms
  // each, so later requests wait for the worker and their latency grows past 8 ms.
  LoadResult r =
      RunLoad({.workers = 1, .duration = absl::Milliseconds(100), .rate = 200}, OnThreads([](int) {
                std::this_thread::sleep_for(std::chrono::milliseconds(8));
                return true;
              }));
  EXPECT_EQ(r.Ok(), 20);
  std::vector<double> latency = r.latency[0];
  EXPECT_GT(latency.back(), latency.front() + 0.02);  // queueing counted, not omitted
}

TEST(LoadgenTest, ManyCallsInFlightFromOneIssuer) {
  // 32 slots of 20 ms calls, 96 calls in all: many of the 32 in flight at once, never more.
  // (Bounded by count, not time: how many calls fit in a time window depends on the machine.)
  std::atomic<int> in_flight{0};
  std::atomic<int> most{0};
  LoadResult r = RunLoad({.workers = 32, .duration = absl::Seconds(30), .max_calls = 32 * 3},
                         OnThreads([&](int) {
                           const int now = ++in_flight;
                           int seen = most.load();
                           while (now > seen && !most.compare_exchange_weak(seen, now)) {
                           }
                           std::this_thread::sleep_for(std::chrono::milliseconds(20));
                           --in_flight;
                           return true;
                         }));
  EXPECT_LE(most.load(), 32);
  EXPECT_GE(most.load(), 16);
  EXPECT_EQ(r.Ok(), 32 * 3);
}

TEST(LoadgenTest, ACallThatEndsAtOnceDoesNotGrowTheStack) {
  // Every call ends inside call(): 100000 of them on one slot.
  int64_t calls = 0;
  LoadResult r = RunLoad({.workers = 1, .duration = absl::Seconds(30), .max_calls = 100000},
                         [&](int, Done done) {
                           ++calls;
                           done(true);
                         });
  EXPECT_EQ(r.Ok(), 100000);
}

TEST(LoadgenTest, TimeOneCallWaitsAndReportsFailure) {
  EXPECT_GE(TimeOneCall(OnThreads([](int) {
              std::this_thread::sleep_for(std::chrono::milliseconds(5));
              return true;
            })),
            0.004);
  EXPECT_LT(TimeOneCall(OnThreads([](int) { return false; })), 0);
}

TEST(LoadgenTest, PercentileAndJainIndex) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_EQ(Percentile({3, 1, 2}, 0.5), 2);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 0.99), 4);
  EXPECT_DOUBLE_EQ(JainIndex({5, 5, 5, 5}), 1.0);
  EXPECT_DOUBLE_EQ(JainIndex({1, 0, 0, 0}), 0.25);
  EXPECT_NEAR(JainIndex({1, 2}), 9.0 / 10.0, 1e-12);
}

}  // namespace
}  // namespace tessera::bench
