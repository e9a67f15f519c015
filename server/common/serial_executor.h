#ifndef TESSERA_SERVER_COMMON_SERIAL_EXECUTOR_H_
#define TESSERA_SERVER_COMMON_SERIAL_EXECUTOR_H_

#include <cstddef>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

/// Runs tasks on owned threads: with one thread (the default) one at a time, in submission
/// order. Used to keep blocking work (durable commits, context creation, tensor copies) off
/// gRPC's callback threads.
///
/// Thread-safe. Tasks must not call Schedule() re-entrantly and wait for the result.
class SerialExecutor {
 public:
  /// `max_pending` bounds the queue; Schedule() refuses beyond it. `threads` > 1 runs that
  /// many tasks at once (their order is then only the order they start in).
  SerialExecutor(std::string name, size_t max_pending, int threads = 1);
  /// Runs the tasks already queued, then joins the thread.
  ~SerialExecutor();

  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  /// Queues `task`. RESOURCE_EXHAUSTED when `max_pending` tasks are waiting;
  /// UNAVAILABLE after Stop().
  absl::Status Schedule(absl::AnyInvocable<void() &&> task) ABSL_LOCKS_EXCLUDED(mu_);

  /// Refuses new tasks, runs the queued ones and joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const size_t max_pending_;
  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMON_SERIAL_EXECUTOR_H_
