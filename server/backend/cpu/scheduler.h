#ifndef TESSERA_SERVER_BACKEND_CPU_SCHEDULER_H_
#define TESSERA_SERVER_BACKEND_CPU_SCHEDULER_H_

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

#include "kernels/cpu/parallel.h"

namespace tessera {

class CpuScheduler;

/// One tenant's view of the CPU scheduler: `streams` ordered queues. Work on one stream runs
/// in submission order, one item at a time; streams and tenants run concurrently.
///
/// Thread-safe. Releasing it (the QueuePtr) cancels what is queued and waits for its
/// running work — or, when released from inside one of its own tasks, lets that task finish
/// and is deleted by the worker afterwards. Release it before the scheduler is destroyed.
class CpuTenantQueue {
 public:
  /// Runs on a worker with a Parallel that spreads chunks over the pool (charged to this
  /// tenant). `cancelled` is true when the work was cancelled or the scheduler stopped
  /// before it started; the task must then only clean up.
  using Task = absl::AnyInvocable<void(kernels::Parallel& parallel, bool cancelled) &&>;

  /// Appends `task` to `stream` (0 <= stream < streams, checked by the caller).
  ///
  /// With `may_run_inline` (small work: microseconds), the task runs at once on the calling
  /// thread instead when that overtakes no one: its stream is idle and fair order would run
  /// it next anyway (no runnable tenant has less charged time). It is charged to the tenant
  /// like any task. This saves the thread hand-offs (to a worker and back) that dominate a
  /// tiny job's latency, and a quiet tenant's tiny job no longer waits for a worker to finish
  /// a busy tenant's piece of work (at most `threads` such tasks run beside the workers).
  /// The caller must hold no lock the task's completion takes.
  void Submit(int stream, Task task, bool may_run_inline = false);

  /// CPU time charged to this tenant so far.
  absl::Duration busy_time() const;

 private:
  friend class CpuScheduler;
  struct Region;
  CpuTenantQueue(CpuScheduler* scheduler, uint32_t weight, int streams);
  /// Leaving idle: no credit for the time idle (scheduler's mu_ held).
  void WakeLocked();
  /// Has a task that may start or a chunk to claim (scheduler's mu_ held).
  bool RunnableLocked() const;

  CpuScheduler* const scheduler_;
  const uint32_t weight_;
  // Guarded by scheduler_->mu_.
  std::vector<std::deque<Task>> streams_;
  std::vector<bool> stream_busy_;
  std::list<Region*> regions_;  // parallel regions with chunks left to claim
  size_t next_stream_ = 0;      // round-robin start among this tenant's streams
  int64_t queued_ = 0;          // tasks waiting in streams_
  double virtual_time_ = 0;     // charged nanoseconds / weight
  int running_ = 0;             // tasks and chunks running now
  int64_t busy_ns_ = 0;
  bool removed_ = false;
  bool orphaned_ = false;  // released from its own task: the worker deletes it
};

/// A fixed pool of worker threads shared by tenants through weighted fair queueing: the
/// next piece of work (a queued task or a chunk of a running parallel region) always comes
/// from the runnable tenant with the least charged time per unit of weight, so under
/// contention a tenant with twice the weight gets about twice the CPU time, and an idle
/// tenant's share goes to the others. Time is charged as measured per task and per chunk.
///
/// Thread-safe.
class CpuScheduler {
 public:
  /// `threads` workers at nice value `nice` (0..19, relative to the process; 0 leaves them as
  /// they are). Workers run kernels for as long as there is work, while the threads that
  /// receive, authenticate and answer requests run in short bursts: at the same priority a
  /// request arriving while the workers fill every core waits for a kernel's time slice
  /// before it is even read. A positive nice value lets request handling preempt the
  /// workers, which still get every cycle nobody else wants.
  explicit CpuScheduler(int threads, int nice = 0);
  /// Stops (see Stop) and joins the workers.
  ~CpuScheduler();

  struct QueueDeleter {
    void operator()(CpuTenantQueue* queue) const;
  };
  using QueuePtr = std::unique_ptr<CpuTenantQueue, QueueDeleter>;

  /// A queue for a tenant with `weight` (its compute share, 1..100) and `streams` streams.
  QueuePtr AddTenant(uint32_t weight, int streams);

  /// Lets running work finish, cancels queued work (tasks run with cancelled=true) and joins
  /// the workers. Idempotent.
  void Stop();

  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  friend class CpuTenantQueue;
  class RegionParallel;

  void WorkerLoop();
  /// The tenant with runnable work and the least virtual time; nullptr when none.
  CpuTenantQueue* PickLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ChargeLocked(CpuTenantQueue* q, int64_t ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// Runs one chunk of `q`'s first region with chunks left (mu_ held on entry and exit).
  void RunChunkLocked(CpuTenantQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// Runs `task` of `q`'s `stream` on this thread (mu_ held on entry and exit; the stream is
  /// marked busy and a worker slot taken by the caller).
  void RunTaskLocked(CpuTenantQueue* q, size_t stream, CpuTenantQueue::Task task)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// Cancels `q`'s queued work and deletes it once nothing of it runs (see QueuePtr).
  void Retire(CpuTenantQueue* q);
  /// Deletes `q` if it was orphaned and nothing of it runs any more.
  void ReapLocked(CpuTenantQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::list<CpuTenantQueue*> tenants_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // threads running a task or chunk (workers, inline)
  int inline_ ABSL_GUARDED_BY(mu_) = 0;  // of which callers of Submit running their task
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_CPU_SCHEDULER_H_
