#ifndef TESSERA_SERVER_CORE_JOB_SCHEDULER_H_
#define TESSERA_SERVER_CORE_JOB_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "server/common/tenant.h"
#include "server/core/memory_ledger.h"

namespace tessera {

/// A job waiting in a tenant's stream queue, as the scheduler sees it.
struct JobTicket {
  int stream = 0;
  /// A job still queued at this time leaves the queue with DEADLINE_EXCEEDED.
  absl::Time deadline = absl::InfiniteFuture();
  /// Memory the job allocates while it runs besides its outputs (reserved at release).
  uint64_t scratch_bytes = 0;
  /// Called once, with no scheduler lock held, when the job is released to run now; it owns
  /// the reserved scratch and must eventually call Queue::Completed for the job's stream.
  absl::AnyInvocable<void(MemoryCharge scratch) &&> release;
  /// Called once, with no scheduler lock held, when the job leaves the queue without
  /// running: DEADLINE_EXCEEDED (deadline passed) or RESOURCE_EXHAUSTED (its scratch can
  /// never fit the quota). Not called for Cancel, TakeAll or Close (the caller knows).
  absl::AnyInvocable<void(absl::Status) &&> drop;
};

/// The one job model of every backend: per-stream FIFO queues per tenant, released to the
/// backend with a bounded number in flight per stream and per device, in weighted fair order
/// across the tenants of a device (priority first, then the least run time charged per unit
/// of compute share), with per-job deadlines and cancellation of queued jobs. A backend
/// context only ever sees jobs released to run now.
///
/// Thread-safe. Lock order: callers may hold their own lock (TenantRuntime::mu_) while calling
/// Queue::Enqueue/Cancel/TakeAll/Close, which take only the scheduler's mutex and the memory
/// ledger's leaf mutex and call nothing else. Dispatch() and Completed() call the tickets'
/// callbacks, so they must be called with no lock held. Callbacks run on the thread that
/// called Dispatch() or Completed(), or on the scheduler's deadline thread.
class JobScheduler : public std::enable_shared_from_this<JobScheduler> {
 public:
  struct Options {
    /// Per device: most jobs released and not yet completed (0: no bound).
    std::vector<int> device_in_flight;
    /// Most jobs released and not completed per stream (>= 1). More than one lets a GPU
    /// start the next job without a round trip through the host.
    int stream_in_flight = 1;
  };
  static std::shared_ptr<JobScheduler> Create(Options options);
  /// Joins the deadline thread (see Stop).
  ~JobScheduler();

  /// Stops the deadline thread; later deadlines are checked only when jobs are dispatched.
  /// Idempotent.
  void Stop();

  class Queue;
  /// A tenant's queues on `device`: `streams` streams, weighted by compute share.
  std::shared_ptr<Queue> AddTenant(int device, const Quota& quota,
                                   std::shared_ptr<MemoryLedger> ledger) ABSL_LOCKS_EXCLUDED(mu_);

  /// Releases every job that may run now and drops expired ones. Reentrant calls (from a
  /// callback) return at once and the running call goes round again.
  void Dispatch() ABSL_LOCKS_EXCLUDED(mu_);

  /// Jobs released and not completed on `device` now.
  int in_flight(int device) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiting {
    uint64_t id;
    std::unique_ptr<JobTicket> ticket;
  };
  struct Action {
    std::unique_ptr<JobTicket> ticket;
    MemoryCharge scratch;
    absl::Status drop;  // not OK: drop instead of release
  };

  // The deadline thread's state, shared with it so that the scheduler may be destroyed on
  // that thread (by a callback dropping the last reference) without pulling it from under it.
  struct Timer {
    absl::Mutex mu;
    absl::CondVar changed;
    absl::Time next ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
    bool stopping ABSL_GUARDED_BY(mu) = false;
    std::weak_ptr<JobScheduler> scheduler;
  };
  static void DeadlineLoop(std::shared_ptr<Timer> timer);

  explicit JobScheduler(Options options);
  /// Pops what may be released now, in fair order, and what expired.
  void CollectLocked(std::vector<Action>& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLocked(absl::Time now, std::vector<Action>& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// The tenant queue on `device` to release from next; nullptr when none may.
  Queue* PickLocked(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReleasableLocked(const Queue& q, int stream) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteDeadlineLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::shared_ptr<Timer> timer_ = std::make_shared<Timer>();
  mutable absl::Mutex mu_;
  std::list<Queue*> queues_ ABSL_GUARDED_BY(mu_);
  std::vector<int> device_in_flight_ ABSL_GUARDED_BY(mu_);
  absl::Time next_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool dispatching_ ABSL_GUARDED_BY(mu_) = false;
  bool again_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread deadline_thread_;
};

/// One tenant's stream queues. Thread-safe; see JobScheduler for the lock contract.
class JobScheduler::Queue {
 public:
  ~Queue();

  /// Appends `ticket` to its stream; returns an id for Cancel. Never calls out, so the
  /// caller may hold its lock. Call Dispatch() afterwards with no lock held.
  uint64_t Enqueue(std::unique_ptr<JobTicket> ticket);
  /// Removes a queued job; true when it was still queued (its ticket is destroyed unrun).
  bool Cancel(uint64_t id);
  /// Removes every queued job; returns their ids.
  std::vector<uint64_t> TakeAll();
  /// TakeAll, and nothing is queued or released any more.
  std::vector<uint64_t> Close();

  /// A released job of `stream` finished after `run_time` (charged to the tenant's share);
  /// releases what may run now. Call with no lock held.
  void Completed(int stream, absl::Duration run_time);

  /// Queued (not released) jobs.
  int64_t queued() const;

 private:
  friend class JobScheduler;
  Queue(std::shared_ptr<JobScheduler> scheduler, int device, const Quota& quota,
        std::shared_ptr<MemoryLedger> ledger);

  const std::shared_ptr<JobScheduler> scheduler_;
  const int device_;
  const uint32_t weight_;
  const Priority priority_;
  const std::shared_ptr<MemoryLedger> ledger_;
  // Guarded by scheduler_->mu_.
  std::vector<std::deque<Waiting>> streams_;
  std::vector<int> stream_in_flight_;
  int64_t queued_ = 0;
  int in_flight_ = 0;
  double virtual_time_ = 0;      // charged run nanoseconds * 100 / weight
  bool memory_blocked_ = false;  // a head waits for scratch until a completion
  bool closed_ = false;
  size_t next_stream_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_JOB_SCHEDULER_H_
