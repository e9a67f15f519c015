#include "server/common/serial_executor.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(SerialExecutorTest, RunsTasksInOrderOneAtATime) {
  std::vector<int> order;
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};
  {
    SerialExecutor executor("test", 1000);
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(executor
                      .Schedule([&, i] {
                        if (running.fetch_add(1) != 0) overlapped = true;
                        order.push_back(i);
                        running.fetch_sub(1);
                      })
                      .ok());
    }
  }  // destructor drains
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_FALSE(overlapped);
}

TEST(SerialExecutorTest, BoundsTheQueue) {
  // Declared before the executor, which joins its thread: the task may still be inside
  // release.WaitForNotification() when the test body ends.
  absl::Notification release;
  absl::Notification started;
  SerialExecutor executor("bounded", 2);
  ASSERT_TRUE(executor
                  .Schedule([&] {
                    started.Notify();
                    release.WaitForNotification();
                  })
                  .ok());
  started.WaitForNotification();
  EXPECT_TRUE(executor.Schedule([] {}).ok());
  EXPECT_TRUE(executor.Schedule([] {}).ok());
  absl::Status full = executor.Schedule([] {});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  release.Notify();
}

TEST(SerialExecutorTest, RefusesAfterStop) {
  SerialExecutor executor("stopped", 10);
  executor.Stop();
  EXPECT_EQ(executor.Schedule([] {}).code(), absl::StatusCode::kUnavailable);
  executor.Stop();  // idempotent
}

}  // namespace
}  // namespace tessera
