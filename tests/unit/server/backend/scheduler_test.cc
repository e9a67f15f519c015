#include "server/backend/cpu/scheduler.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

void Spin(std::chrono::microseconds d) {
  auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

TEST(CpuSchedulerTest, OneStreamRunsInOrderOneAtATime) {
  CpuScheduler scheduler(3);
  auto queue = scheduler.AddTenant(100, 2);
  std::vector<int> order;
  std::atomic<int> running{0};
  std::atomic<bool> overlap{false};
  absl::Notification done;
  for (int i = 0; i < 200; ++i) {
    queue->Submit(0, [&, i](kernels::Parallel&, bool cancelled) {
      ASSERT_FALSE(cancelled);
      if (running.fetch_add(1) != 0) overlap = true;
      order.push_back(i);
      running.fetch_sub(1);
      if (i == 199) done.Notify();
    });
  }
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_FALSE(overlap);
}

TEST(CpuSchedulerTest, WorkersRunAtTheNiceValueAskedFor) {
  const int base = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  CpuScheduler scheduler(1, /*nice=*/10);
  auto queue = scheduler.AddTenant(100, 1);
  std::atomic<int> seen{-100};
  absl::Notification ran;
  queue->Submit(0, [&](kernels::Parallel&, bool) {
    seen = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
    ran.Notify();
  });
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(seen.load(), std::min(base + 10, 19));
  // The caller's own priority is untouched.
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())), base);
}

TEST(CpuSchedulerTest, SmallWorkOnAnIdleStreamRunsOnTheCallersThread) {
  CpuScheduler scheduler(2);
  auto queue = scheduler.AddTenant(100, 1);
  std::thread::id ran_on;
  queue->Submit(
      0,
      [&](kernels::Parallel&, bool cancelled) {
        EXPECT_FALSE(cancelled);
        ran_on = std::this_thread::get_id();
      },
      /*may_run_inline=*/true);
  EXPECT_EQ(ran_on, std::this_thread::get_id());        // ran before Submit returned
  EXPECT_GT(queue->busy_time(), absl::ZeroDuration());  // and was charged
}

TEST(CpuSchedulerTest, SmallWorkKeepsItsStreamsOrder) {
  // A task runs on the stream: the next one, even if small, waits for it (on a worker).
  absl::Notification release;
  absl::Notification first_started;
  absl::Notification second_ran;
  std::thread::id second_on;
  CpuScheduler scheduler(2);
  auto queue = scheduler.AddTenant(100, 1);
  queue->Submit(0, [&](kernels::Parallel&, bool) {
    first_started.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(20));
  });
  ASSERT_TRUE(first_started.WaitForNotificationWithTimeout(absl::Seconds(20)));
  queue->Submit(
      0,
      [&](kernels::Parallel&, bool) {
        second_on = std::this_thread::get_id();
        second_ran.Notify();
      },
      /*may_run_inline=*/true);
  EXPECT_FALSE(second_ran.HasBeenNotified());
  release.Notify();
  ASSERT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_NE(second_on, std::this_thread::get_id());
}

TEST(CpuSchedulerTest, AQuietTenantsSmallTaskDoesNotWaitBehindABusyTenant) {
  // Both workers are held by a busy tenant with more work queued: the quiet tenant, next in
  // fair order, runs its small task at once on the caller's thread.
  absl::Notification release;
  std::atomic<int> started{0};
  absl::Notification both_started;
  CpuScheduler scheduler(2);
  auto busy = scheduler.AddTenant(100, 4);
  auto quiet = scheduler.AddTenant(100, 1);
  for (int i = 0; i < 4; ++i) {
    busy->Submit(i, [&](kernels::Parallel&, bool) {
      if (started.fetch_add(1) == 1) both_started.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(20));
    });
  }
  ASSERT_TRUE(both_started.WaitForNotificationWithTimeout(absl::Seconds(20)));
  bool ran = false;
  quiet->Submit(
      0, [&](kernels::Parallel&, bool) { ran = true; }, /*may_run_inline=*/true);
  EXPECT_TRUE(ran);
  release.Notify();
}

TEST(CpuSchedulerTest, StreamsAndTenantsRunConcurrently) {
  // Two tasks that each wait for the other: they finish only if they run at once. What they
  // share is declared before the scheduler, which joins its workers: a task can still be
  // inside WaitForNotification when the test body ends.
  std::atomic<int> arrived{0};
  absl::Notification both;
  absl::Notification across;
  CpuScheduler scheduler(2);
  auto a = scheduler.AddTenant(100, 2);
  auto b = scheduler.AddTenant(100, 1);
  auto rendezvous = [&](kernels::Parallel&, bool) {
    if (arrived.fetch_add(1) == 1) both.Notify();
    both.WaitForNotificationWithTimeout(absl::Seconds(20));
  };
  a->Submit(0, rendezvous);
  a->Submit(1, rendezvous);
  EXPECT_TRUE(both.WaitForNotificationWithTimeout(absl::Seconds(20)));
  arrived = 0;
  auto rendezvous2 = [&](kernels::Parallel&, bool) {
    if (arrived.fetch_add(1) == 1) across.Notify();
    across.WaitForNotificationWithTimeout(absl::Seconds(20));
  };
  a->Submit(0, rendezvous2);
  b->Submit(0, rendezvous2);
  EXPECT_TRUE(across.WaitForNotificationWithTimeout(absl::Seconds(20)));
}

TEST(CpuSchedulerTest, ParallelRegionsCoverEveryIndexOnce) {
  CpuScheduler scheduler(3);
  auto queue = scheduler.AddTenant(50, 1);
  const int64_t n = 100003;
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> chunks{0};
  absl::Notification done;
  queue->Submit(0, [&](kernels::Parallel& parallel, bool) {
    EXPECT_EQ(parallel.Concurrency(), 3);
    parallel.For(n, 1000, [&](int64_t b, int64_t e) {
      EXPECT_EQ(b % 1000, 0);
      ++chunks;
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  EXPECT_EQ(chunks.load(), 101);
}

TEST(CpuSchedulerTest, DestroyingAQueueCancelsWhatIsQueued) {
  CpuScheduler scheduler(1);
  auto queue = scheduler.AddTenant(100, 1);
  absl::Notification release, started;
  std::atomic<int> ran{0}, cancelled{0};
  queue->Submit(0, [&](kernels::Parallel&, bool c) {
    EXPECT_FALSE(c);
    started.Notify();
    release.WaitForNotification();
    ++ran;
  });
  for (int i = 0; i < 5; ++i) {
    queue->Submit(0, [&](kernels::Parallel&, bool c) { c ? ++cancelled : ++ran; });
  }
  started.WaitForNotification();
  std::thread destroyer([&] { queue.reset(); });  // waits for the running task
  absl::SleepFor(absl::Milliseconds(50));
  release.Notify();
  destroyer.join();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(cancelled.load(), 5);
}

TEST(CpuSchedulerTest, AQueueReleasedFromItsOwnTaskIsReapedAfterwards) {
  // The last owner of a tenant's context can be a job's completion running on a worker:
  // releasing the queue there must neither deadlock nor free it under the running task.
  CpuScheduler scheduler(2);
  auto holder = std::make_shared<CpuScheduler::QueuePtr>(scheduler.AddTenant(100, 1));
  std::atomic<int> cancelled{0};
  absl::Notification released, both_submitted;
  CpuTenantQueue* queue = holder->get();
  queue->Submit(0, [holder, &both_submitted](kernels::Parallel& parallel, bool) mutable {
    both_submitted.WaitForNotification();  // `queue` is used below until then
    parallel.For(1000, 10, [](int64_t, int64_t) {});
    holder->reset();  // this task is still running
  });
  queue->Submit(0, [&](kernels::Parallel&, bool c) {
    cancelled += c;
    released.Notify();
  });
  holder.reset();
  both_submitted.Notify();
  ASSERT_TRUE(released.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(cancelled.load(), 1);
  // The scheduler keeps working for others.
  auto other = scheduler.AddTenant(100, 1);
  absl::Notification ran;
  other->Submit(0, [&](kernels::Parallel&, bool c) {
    EXPECT_FALSE(c);
    ran.Notify();
  });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(20)));
}

TEST(CpuSchedulerTest, StopCancelsQueuedWorkAndLaterSubmissions) {
  CpuScheduler scheduler(1);
  auto queue = scheduler.AddTenant(100, 1);
  std::atomic<int> cancelled{0};
  scheduler.Stop();
  queue->Submit(0, [&](kernels::Parallel&, bool c) { cancelled += c; });
  EXPECT_EQ(cancelled.load(), 1);
}

TEST(CpuSchedulerTest, WeightsShareTheCpuUnderContention) {
  // Two tenants with compute shares 25 and 50 keep both workers busy (4 streams each); the
  // busy time they are given should be about 1:2. Loose bound: this machine is noisy.
  CpuScheduler scheduler(2);
  auto light = scheduler.AddTenant(25, 4);
  auto heavy = scheduler.AddTenant(50, 4);
  std::atomic<bool> stop{false};
  auto task = [&](kernels::Parallel&, bool c) {
    if (!c && !stop) Spin(std::chrono::microseconds(500));
  };
  for (int i = 0; i < 4000; ++i) {  // ~2 s of work each: more than the measured window
    light->Submit(i % 4, task);
    heavy->Submit(i % 4, task);
  }
  absl::SleepFor(absl::Milliseconds(100));  // settle
  absl::Duration light0 = light->busy_time(), heavy0 = heavy->busy_time();
  absl::SleepFor(absl::Milliseconds(1200));
  double l = absl::ToDoubleSeconds(light->busy_time() - light0);
  double h = absl::ToDoubleSeconds(heavy->busy_time() - heavy0);
  stop = true;
  ASSERT_GT(l, 0.05);
  double ratio = h / l;
  std::printf("busy time: heavy (share 50) %.3f s, light (share 25) %.3f s, ratio %.2f\n", h, l,
              ratio);
  EXPECT_GT(ratio, 2.0 * 0.85) << "heavy " << h << " s, light " << l << " s";
  EXPECT_LT(ratio, 2.0 * 1.15) << "heavy " << h << " s, light " << l << " s";
}

TEST(CpuSchedulerTest, AnIdleTenantsShareGoesToOthers) {
  CpuScheduler scheduler(2);
  auto idle = scheduler.AddTenant(90, 1);
  auto busy = scheduler.AddTenant(10, 2);
  std::atomic<int> concurrent{0}, max_concurrent{0};
  std::atomic<int> remaining{40};
  absl::Notification done;
  for (int i = 0; i < 40; ++i) {
    busy->Submit(i % 2, [&](kernels::Parallel&, bool) {
      int now = ++concurrent;
      int prev = max_concurrent.load();
      while (now > prev && !max_concurrent.compare_exchange_weak(prev, now)) {
      }
      Spin(std::chrono::microseconds(2000));
      --concurrent;
      if (--remaining == 0) done.Notify();
    });
  }
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(max_concurrent.load(), 2);  // both workers, despite a 10% share
}

}  // namespace
}  // namespace tessera
