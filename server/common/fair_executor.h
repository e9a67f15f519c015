#ifndef TESSERA_SERVER_COMMON_FAIR_EXECUTOR_H_
#define TESSERA_SERVER_COMMON_FAIR_EXECUTOR_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

/// Runs tasks on owned threads, choosing among the tenants (keys) that have tasks waiting the
/// one that has had the least service for its weight: start-time weighted fair queueing, the
/// idea the job scheduler applies to kernels, applied to the server's own work (tensor
/// transfers, durable commits). A tenant that submits one task beside tenants with hundreds
/// queued runs next, not after them; tenants that are all busy share the threads in
/// proportion to their weights. Within one key, tasks start in submission order.
///
/// A key that goes idle keeps no credit: it re-enters at the current virtual time. Memory is
/// bounded by `max_pending` (all keys) and `max_pending_per_key`; keys with nothing queued or
/// running are forgotten.
///
/// Thread-safe. Tasks run without the executor's lock held; they must not wait for a task
/// they schedule.
class FairExecutor {
 public:
  FairExecutor(std::string name, size_t max_pending, size_t max_pending_per_key, int threads);
  /// Runs the tasks already queued, then joins the threads.
  ~FairExecutor();

  FairExecutor(const FairExecutor&) = delete;
  FairExecutor& operator=(const FairExecutor&) = delete;

  /// Queues `task` for `key` with `weight` (> 0; a tenant's compute share). RESOURCE_EXHAUSTED
  /// when the executor or the key has its most tasks waiting, with the refusal reason
  /// "transfer_queue" and a retry hint (telemetry.h); UNAVAILABLE after Stop().
  absl::Status Schedule(absl::string_view key, double weight, absl::AnyInvocable<void() &&> task)
      ABSL_LOCKS_EXCLUDED(mu_);

  /// Refuses new tasks, runs the queued ones and joins the threads. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  /// Tasks waiting (not running), for tests and metrics.
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queue {
    std::deque<absl::AnyInvocable<void() &&>> tasks;
    double weight = 1;
    double virtual_start = 0;  // the virtual time at which its next task starts
    int running = 0;
  };

  void Loop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const size_t max_pending_;
  const size_t max_pending_per_key_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Queue> queues_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  double virtual_time_ ABSL_GUARDED_BY(mu_) = 0;  // the start of the last task dispatched
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMON_FAIR_EXECUTOR_H_
