#include "server/core/job_scheduler.h"

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

Quota QuotaOf(uint32_t share, Priority priority = Priority::kNormal, uint32_t streams = 2) {
  return Quota{.device_memory_bytes = 1000,
               .compute_share_percent = share,
               .max_streams = streams,
               .max_queued_jobs = 1000,
               .priority = priority};
}

// Records releases and drops; released jobs stay "running" until Complete().
class ReleaseRecorder {
 public:
  std::unique_ptr<JobTicket> Ticket(int tag, int stream = 0, uint64_t scratch = 0,
                                    absl::Time deadline = absl::InfiniteFuture()) {
    auto t = std::make_unique<JobTicket>();
    t->stream = stream;
    t->scratch_bytes = scratch;
    t->deadline = deadline;
    t->release = [this, tag](MemoryCharge charge) {
      absl::MutexLock lock(&mu_);
      released_.push_back(tag);
      charges_.push_back(std::move(charge));
    };
    t->drop = [this, tag](absl::Status why) {
      absl::MutexLock lock(&mu_);
      dropped_.emplace_back(tag, why.code());
    };
    return t;
  }
  std::vector<int> released() {
    absl::MutexLock lock(&mu_);
    return released_;
  }
  std::vector<std::pair<int, absl::StatusCode>> dropped() {
    absl::MutexLock lock(&mu_);
    return dropped_;
  }
  void FreeScratch() {
    absl::MutexLock lock(&mu_);
    charges_.clear();
  }
  // Releases and drops may happen on another thread that is dispatching (the deadline
  // thread): wait until there are at least `n`.
  bool AwaitReleased(size_t n, absl::Duration timeout) { return Await(released_, n, timeout); }
  bool AwaitDropped(size_t n, absl::Duration timeout) { return Await(dropped_, n, timeout); }

 private:
  absl::Mutex mu_;
  std::vector<int> released_ ABSL_GUARDED_BY(mu_);
  std::vector<MemoryCharge> charges_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, absl::StatusCode>> dropped_ ABSL_GUARDED_BY(mu_);

  template <typename T>
  bool Await(const std::vector<T>& seen, size_t n, absl::Duration timeout) {
    using Want = std::pair<const std::vector<T>*, size_t>;
    Want want(&seen, n);
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](Want* w) { return w->first->size() >= w->second; }, &want),
                                timeout);
  }
};

std::shared_ptr<MemoryLedger> Ledger(uint64_t quota = 1000) {
  return MemoryLedger::Create("t", quota);
}

TEST(JobSchedulerTest, AStreamReleasesInOrderWithABoundedNumberInFlight) {
  auto scheduler = JobScheduler::Create({.device_in_flight = {0}, .stream_in_flight = 2});
  auto q = scheduler->AddTenant(0, QuotaOf(100), Ledger());
  ReleaseRecorder r;
  for (int i = 1; i <= 5; ++i) q->Enqueue(r.Ticket(i));
  EXPECT_EQ(q->queued(), 5);
  scheduler->Dispatch();
  EXPECT_THAT(r.released(), ElementsAre(1, 2));
  EXPECT_EQ(q->queued(), 3);
  q->Completed(0, absl::Milliseconds(1));
  EXPECT_THAT(r.released(), ElementsAre(1, 2, 3));
  q->Completed(0, absl::Milliseconds(1));
  q->Completed(0, absl::Milliseconds(1));
  EXPECT_THAT(r.released(), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(scheduler->in_flight(0), 2);
}

TEST(JobSchedulerTest, StreamsOfATenantDoNotWaitForEachOther) {
  auto scheduler = JobScheduler::Create({.device_in_flight = {0}, .stream_in_flight = 1});
  auto q = scheduler->AddTenant(0, QuotaOf(100), Ledger());
  ReleaseRecorder r;
  q->Enqueue(r.Ticket(1, 0));
  q->Enqueue(r.Ticket(2, 0));
  q->Enqueue(r.Ticket(3, 1));
  scheduler->Dispatch();
  EXPECT_THAT(r.released(), ElementsAre(1, 3));
}

TEST(JobSchedulerTest, ASharedDeviceIsReleasedInWeightedFairOrder) {
  auto scheduler = JobScheduler::Create({.device_in_flight = {1}, .stream_in_flight = 1});
  auto heavy = scheduler->AddTenant(0, QuotaOf(75), Ledger());
  auto light = scheduler->AddTenant(0, QuotaOf(25), Ledger());
  ReleaseRecorder rh, rl;
  for (int i = 0; i < 100; ++i) {
    heavy->Enqueue(rh.Ticket(i));
    light->Enqueue(rl.Ticket(i));
  }
  // One slot: whoever holds it completes its job (1 ms), which releases the next in fair order.
  size_t seen_heavy = 0;
  auto holder = [&]() {
    const size_t now = rh.released().size();
    const bool is_heavy = now > seen_heavy;
    seen_heavy = now;
    return is_heavy ? heavy.get() : light.get();
  };
  scheduler->Dispatch();
  for (int i = 0; i < 80; ++i) holder()->Completed(0, absl::Milliseconds(1));
  const size_t h = rh.released().size(), l = rl.released().size();
  EXPECT_EQ(h + l, 81u);
  // 3:1 by compute share, within a couple of jobs.
  EXPECT_NEAR(static_cast<double>(h) / static_cast<double>(l), 3.0, 0.4) << h << " vs " << l;
}

TEST(JobSchedulerTest, NormalPriorityGoesBeforeLow) {
  auto scheduler = JobScheduler::Create({.device_in_flight = {1}, .stream_in_flight = 1});
  auto low = scheduler->AddTenant(0, QuotaOf(100, Priority::kLow), Ledger());
  auto normal = scheduler->AddTenant(0, QuotaOf(1), Ledger());
  ReleaseRecorder rl, rn;
  low->Enqueue(rl.Ticket(1));
  normal->Enqueue(rn.Ticket(1));
  normal->Enqueue(rn.Ticket(2));
  scheduler->Dispatch();
  EXPECT_THAT(rn.released(), ElementsAre(1));
  normal->Completed(0, absl::Milliseconds(5));
  EXPECT_THAT(rn.released(), ElementsAre(1, 2));
  EXPECT_TRUE(rl.released().empty());
  normal->Completed(0, absl::Milliseconds(5));
  EXPECT_THAT(rl.released(), ElementsAre(1));
}

TEST(JobSchedulerTest, CancelTakesOnlyQueuedJobs) {
  auto scheduler = JobScheduler::Create({.device_in_flight = {0}, .stream_in_flight = 1});
  auto q = scheduler->AddTenant(0, QuotaOf(100), Ledger());
  ReleaseRecorder r;
  uint64_t first = q->Enqueue(r.Ticket(1));
  uint64_t second = q->Enqueue(r.Ticket(2));
  uint64_t third = q->Enqueue(r.Ticket(3));
  scheduler->Dispatch();
  EXPECT_FALSE(q->Cancel(first));  // released
  EXPECT_TRUE(q->Cancel(second));
  EXPECT_FALSE(q->Cancel(second));
  q->Completed(0, absl::ZeroDuration());
  EXPECT_THAT(r.released(), ElementsAre(1, 3));
  EXPECT_FALSE(q->Cancel(third));
  EXPECT_TRUE(r.dropped().empty());  // cancel is the caller's to report
}

TEST(JobSchedulerTest, AQueuedJobPastItsDeadlineIsDroppedWithoutRunning) {
  auto scheduler = JobScheduler::Create({.device_in_flight = {0}, .stream_in_flight = 1});
  auto q = scheduler->AddTenant(0, QuotaOf(100), Ledger());
  ReleaseRecorder r;
  q->Enqueue(r.Ticket(1));  // runs and never completes
  q->Enqueue(r.Ticket(2, 0, 0, absl::Now() + absl::Milliseconds(50)));
  q->Enqueue(r.Ticket(3));
  scheduler->Dispatch();
  // The deadline thread notices without any other event.
  ASSERT_TRUE(r.AwaitDropped(1, absl::Seconds(10)));
  EXPECT_THAT(r.dropped(), ElementsAre(std::make_pair(2, absl::StatusCode::kDeadlineExceeded)));
  EXPECT_EQ(q->queued(), 1);
  q->Completed(0, absl::ZeroDuration());
  ASSERT_TRUE(r.AwaitReleased(2, absl::Seconds(10)));
  EXPECT_THAT(r.released(), ElementsAre(1, 3));
}

TEST(JobSchedulerTest, ScratchIsReservedBeforeReleaseAndAJobWaitsForIt) {
  auto scheduler = JobScheduler::Create({.device_in_flight = {0}, .stream_in_flight = 1});
  auto ledger = Ledger(100);
  auto q = scheduler->AddTenant(0, QuotaOf(100), ledger);
  ReleaseRecorder r;
  q->Enqueue(r.Ticket(1, 0, 80));
  q->Enqueue(r.Ticket(2, 1, 80));  // another stream, but the quota has no room yet
  scheduler->Dispatch();
  EXPECT_THAT(r.released(), ElementsAre(1));
  EXPECT_EQ(ledger->snapshot().scratch, 80u);
  r.FreeScratch();  // the first job's scratch is returned with its completion
  q->Completed(0, absl::ZeroDuration());
  EXPECT_THAT(r.released(), ElementsAre(1, 2));
  r.FreeScratch();
  q->Completed(1, absl::ZeroDuration());
  // A job whose scratch can never fit while nothing runs fails instead of waiting forever.
  q->Enqueue(r.Ticket(3, 0, 101));
  scheduler->Dispatch();
  EXPECT_THAT(r.dropped(), ElementsAre(std::make_pair(3, absl::StatusCode::kResourceExhausted)));
  EXPECT_EQ(ledger->used(), 0u);
}

TEST(JobSchedulerTest, CloseTakesEverythingQueuedAndReleasesNothingMore) {
  auto scheduler = JobScheduler::Create({.device_in_flight = {0}, .stream_in_flight = 1});
  auto q = scheduler->AddTenant(0, QuotaOf(100), Ledger());
  ReleaseRecorder r;
  q->Enqueue(r.Ticket(1));
  scheduler->Dispatch();
  uint64_t a = q->Enqueue(r.Ticket(2));
  uint64_t b = q->Enqueue(r.Ticket(3, 1));
  EXPECT_THAT(r.released(), ElementsAre(1));  // nothing dispatched since
  std::vector<uint64_t> taken = q->Close();
  EXPECT_THAT(taken, ElementsAre(a, b));
  q->Completed(0, absl::ZeroDuration());
  EXPECT_THAT(r.released(), ElementsAre(1));
}

}  // namespace
}  // namespace tessera
