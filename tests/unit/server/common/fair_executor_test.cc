#include "server/common/fair_executor.h"

#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

#include "server/common/telemetry.h"

namespace tessera {
namespace {

// Records the order in which tasks ran, by key.
class TaskRecorder {
 public:
  void Ran(std::string key) {
    absl::MutexLock lock(&mu_);
    order_.push_back(std::move(key));
  }
  std::vector<std::string> order() {
    absl::MutexLock lock(&mu_);
    return order_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> order_;
};

TEST(FairExecutorTest, AQuietKeyRunsBeforeABusyKeysBacklog) {
  // Declared before the executor, which joins its threads when its block ends.
  absl::Notification release;
  absl::Notification started;
  TaskRecorder recorder;
  {
    FairExecutor executor("test", 1000, 1000, 1);
    // Destroyed before the executor: a failed assertion still lets its thread finish.
    absl::Cleanup open_gate = [&] {
      if (!release.HasBeenNotified()) release.Notify();
    };
    ASSERT_TRUE(executor
                    .Schedule("busy", 1,
                              [&] {
                                started.Notify();
                                release.WaitForNotification();
                              })
                    .ok());
    started.WaitForNotification();
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(executor.Schedule("busy", 1, [&] { recorder.Ran("busy"); }).ok());
    }
    ASSERT_TRUE(executor.Schedule("quiet", 1, [&] { recorder.Ran("quiet"); }).ok());
    release.Notify();
  }  // the destructor drains
  const std::vector<std::string> order = recorder.order();
  ASSERT_EQ(order.size(), 101u);
  size_t quiet_at = 0;
  while (order[quiet_at] != "quiet") ++quiet_at;
  EXPECT_LE(quiet_at, 1u) << "the quiet key waited behind the busy key's backlog";
}

TEST(FairExecutorTest, BusyKeysShareInProportionToTheirWeights) {
  // Declared before the executor, which joins its threads when its block ends.
  absl::Notification release;
  absl::Notification started;
  TaskRecorder recorder;
  {
    FairExecutor executor("test", 10000, 1000, 1);
    // Destroyed before the executor: a failed assertion still lets its thread finish.
    absl::Cleanup open_gate = [&] {
      if (!release.HasBeenNotified()) release.Notify();
    };
    ASSERT_TRUE(executor
                    .Schedule("gate", 1,
                              [&] {
                                started.Notify();
                                release.WaitForNotification();
                              })
                    .ok());
    started.WaitForNotification();
    for (int i = 0; i < 400; ++i) {
      ASSERT_TRUE(executor.Schedule("light", 1, [&] { recorder.Ran("light"); }).ok());
      ASSERT_TRUE(executor.Schedule("heavy", 3, [&] { recorder.Ran("heavy"); }).ok());
    }
    release.Notify();
  }
  const std::vector<std::string> order = recorder.order();
  ASSERT_EQ(order.size(), 800u);
  int heavy = 0;
  for (size_t i = 0; i < 400; ++i) heavy += order[i] == "heavy" ? 1 : 0;
  EXPECT_NEAR(heavy, 300, 3);  // 3:1 while both have work
}

TEST(FairExecutorTest, KeepsEachKeysOrderAndBoundsItsQueue) {
  // Declared before the executor, which joins its threads when its block ends.
  absl::Notification release;
  absl::Notification started;
  std::vector<int> order;
  {
    FairExecutor executor("bounded", 100, 3, 1);
    // Destroyed before the executor: a failed assertion still lets its thread finish.
    absl::Cleanup open_gate = [&] {
      if (!release.HasBeenNotified()) release.Notify();
    };
    ASSERT_TRUE(executor
                    .Schedule("a", 1,
                              [&] {
                                started.Notify();
                                release.WaitForNotification();
                              })
                    .ok());
    started.WaitForNotification();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(executor.Schedule("a", 1, [&order, i] { order.push_back(i); }).ok());
    }
    absl::Status full = executor.Schedule("a", 1, [] {});
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(full.message().find("\"a\""), std::string::npos) << full;
    // Counted as its own refusal reason, with a retry hint the call layer sends as a trailer.
    EXPECT_EQ(telemetry::RefusalReason(full), "transfer_queue");
    EXPECT_GT(telemetry::RetryAfterMs(full), 0);
    EXPECT_TRUE(executor.Schedule("b", 1, [] {}).ok());  // another key is not affected
    EXPECT_EQ(executor.pending(), 4u);
    release.Notify();
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(FairExecutorTest, RefusesAfterStop) {
  FairExecutor executor("stopped", 10, 10, 2);
  executor.Stop();
  EXPECT_EQ(executor.Schedule("a", 1, [] {}).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tessera
