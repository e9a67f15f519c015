#include "server/backend/cpu/scheduler.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <limits>

#include <sys/resource.h>
#include <unistd.h>

namespace tessera {
namespace {

// The queue whose task or chunk this worker thread is running (nullptr elsewhere).
thread_local CpuTenantQueue* running_queue = nullptr;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Lowers the calling thread's priority by `nice` steps (Linux: per thread), at most to 19.
void LowerThisThreadsPriority(int nice) {
  if (nice <= 0) return;
  const id_t self = static_cast<id_t>(gettid());
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, self);
  if (errno != 0) return;
  (void)setpriority(PRIO_PROCESS, self, std::min(current + nice, 19));
}

}  // namespace

struct CpuTenantQueue::Region {
  int64_t n = 0;
  int64_t grain = 1;
  absl::FunctionRef<void(int64_t, int64_t)> body;
  int64_t next = 0;     // start of the next unclaimed chunk
  int outstanding = 0;  // chunks claimed and not finished
};

// The Parallel handed to a running task: its chunks are offered to idle workers through
// the task's tenant, so they are scheduled (and charged) like any of the tenant's work.
class CpuScheduler::RegionParallel final : public kernels::Parallel {
 public:
  RegionParallel(CpuScheduler* scheduler, CpuTenantQueue* queue)
      : scheduler_(scheduler), queue_(queue) {}

  void For(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> body) override {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    if (n <= grain) {
      body(0, n);
      return;
    }
    CpuTenantQueue::Region region{n, grain, body};
    absl::MutexLock lock(&scheduler_->mu_);
    queue_->regions_.push_back(&region);
    while (region.next < region.n) {
      int64_t begin = region.next;
      region.next = std::min(region.n, begin + region.grain);
      if (region.next >= region.n) queue_->regions_.remove(&region);
      ++region.outstanding;
      scheduler_->mu_.Unlock();
      body(begin, std::min(region.n, begin + region.grain));
      scheduler_->mu_.Lock();
      --region.outstanding;
    }
    // Wait for chunks other workers took; that time is not charged (the worker idles).
    int64_t wait_start = NowNs();
    scheduler_->mu_.Await(absl::Condition(
        +[](CpuTenantQueue::Region* r) { return r->outstanding == 0; }, &region));
    wait_ns_ += NowNs() - wait_start;
  }

  int Concurrency() const override { return scheduler_->threads(); }
  int AloneConcurrency() const override {
    absl::MutexLock lock(&scheduler_->mu_);
    return scheduler_->active_ == 1 && !scheduler_->HasWorkLocked() ? scheduler_->threads() : 1;
  }
  int64_t wait_ns() const { return wait_ns_; }

 private:
  CpuScheduler* const scheduler_;
  CpuTenantQueue* const queue_;
  int64_t wait_ns_ = 0;
};

CpuTenantQueue::CpuTenantQueue(CpuScheduler* scheduler, uint32_t weight, int streams)
    : scheduler_(scheduler),
      weight_(std::max<uint32_t>(1, weight)),
      streams_(static_cast<size_t>(streams)),
      stream_busy_(static_cast<size_t>(streams), false) {}

void CpuScheduler::QueueDeleter::operator()(CpuTenantQueue* queue) const {
  queue->scheduler_->Retire(queue);
}

void CpuTenantQueue::Submit(int stream, Task task, bool may_run_inline) {
  {
    absl::MutexLock lock(&scheduler_->mu_);
    const size_t s = static_cast<size_t>(stream);
    if (may_run_inline && !removed_ && !scheduler_->stopping_ && !stream_busy_[s] &&
        streams_[s].empty() && scheduler_->inline_ < scheduler_->threads()) {
      if (queued_ == 0 && running_ == 0) WakeLocked();
      // Fair order says this task runs next when no runnable tenant has less charged time;
      // it then starts now on this thread rather than after a worker's current piece of work.
      bool next = true;
      for (const CpuTenantQueue* other : scheduler_->tenants_) {
        if (other != this && other->RunnableLocked() && other->virtual_time_ < virtual_time_) {
          next = false;
          break;
        }
      }
      if (next) {
        CpuScheduler* const scheduler = scheduler_;  // `this` may be gone after the task
        stream_busy_[s] = true;
        ++running_;
        ++scheduler->active_;
        ++scheduler->inline_;
        scheduler->RunTaskLocked(this, s, std::move(task));
        --scheduler->inline_;
        return;
      }
    }
    if (!removed_ && !scheduler_->stopping_) {
      if (queued_ == 0 && running_ == 0) WakeLocked();
      streams_[s].push_back(std::move(task));
      ++queued_;
      return;
    }
  }
  // Removed or stopping: nothing will run it, so it is cancelled here.
  kernels::SerialParallel serial;
  std::move(task)(serial, /*cancelled=*/true);
}

void CpuTenantQueue::WakeLocked() {
  // Waking from idle: start at the least virtual time among busy tenants, so time spent
  // idle is not banked as credit.
  double floor = std::numeric_limits<double>::infinity();
  for (CpuTenantQueue* other : scheduler_->tenants_) {
    if (other != this && (other->queued_ > 0 || other->running_ > 0)) {
      floor = std::min(floor, other->virtual_time_);
    }
  }
  if (floor != std::numeric_limits<double>::infinity()) {
    virtual_time_ = std::max(virtual_time_, floor);
  }
}

bool CpuTenantQueue::RunnableLocked() const {
  if (!regions_.empty()) return true;
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (!stream_busy_[i] && !streams_[i].empty()) return true;
  }
  return false;
}

absl::Duration CpuTenantQueue::busy_time() const {
  absl::MutexLock lock(&scheduler_->mu_);
  return absl::Nanoseconds(busy_ns_);
}

CpuScheduler::CpuScheduler(int threads, int nice) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    workers_.emplace_back([this, nice] {
      LowerThisThreadsPriority(nice);
      WorkerLoop();
    });
  }
}

CpuScheduler::~CpuScheduler() { Stop(); }

CpuScheduler::QueuePtr CpuScheduler::AddTenant(uint32_t weight, int streams) {
  QueuePtr queue(new CpuTenantQueue(this, weight, streams));
  absl::MutexLock lock(&mu_);
  tenants_.push_back(queue.get());
  return queue;
}

void CpuScheduler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

CpuTenantQueue* CpuScheduler::PickLocked() const {
  CpuTenantQueue* best = nullptr;
  for (CpuTenantQueue* q : tenants_) {
    if (q->RunnableLocked() && (best == nullptr || q->virtual_time_ < best->virtual_time_)) {
      best = q;
    }
  }
  return best;
}

bool CpuScheduler::HasWorkLocked() const { return PickLocked() != nullptr; }

void CpuScheduler::ChargeLocked(CpuTenantQueue* q, int64_t ns) {
  if (ns <= 0) return;
  q->busy_ns_ += ns;
  q->virtual_time_ += static_cast<double>(ns) * 100.0 / q->weight_;
}

void CpuScheduler::RunChunkLocked(CpuTenantQueue* q) {
  CpuTenantQueue::Region* region = q->regions_.front();
  int64_t begin = region->next;
  region->next = std::min(region->n, begin + region->grain);
  if (region->next >= region->n) q->regions_.pop_front();
  ++region->outstanding;
  ++q->running_;
  mu_.Unlock();
  CpuTenantQueue* outer = running_queue;
  running_queue = q;
  int64_t start = NowNs();
  region->body(begin, std::min(region->n, begin + region->grain));
  int64_t elapsed = NowNs() - start;
  running_queue = outer;
  mu_.Lock();
  ChargeLocked(q, elapsed);
  --q->running_;
  --region->outstanding;  // may release the region's owner; `region` is dead after this
  ReapLocked(q);
}

void CpuScheduler::WorkerLoop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](CpuScheduler* s)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->stopping_ || s->HasWorkLocked(); },
        this));
    CpuTenantQueue* q = PickLocked();
    if (q == nullptr) {
      if (stopping_) return;
      continue;
    }
    if (!q->regions_.empty()) {
      ++active_;
      RunChunkLocked(q);
      --active_;
      continue;
    }
    // The tenant's next stream (round-robin) whose head may start.
    size_t count = q->streams_.size();
    size_t stream = count;
    for (size_t i = 0; i < count; ++i) {
      size_t s = (q->next_stream_ + i) % count;
      if (!q->stream_busy_[s] && !q->streams_[s].empty()) {
        stream = s;
        break;
      }
    }
    q->next_stream_ = (stream + 1) % count;
    CpuTenantQueue::Task task = std::move(q->streams_[stream].front());
    q->streams_[stream].pop_front();
    --q->queued_;
    q->stream_busy_[stream] = true;
    ++q->running_;
    ++active_;
    RunTaskLocked(q, stream, std::move(task));
  }
}

void CpuScheduler::RunTaskLocked(CpuTenantQueue* q, size_t stream, CpuTenantQueue::Task task) {
  const bool cancelled = stopping_ || q->removed_;
  mu_.Unlock();
  RegionParallel parallel(this, q);
  CpuTenantQueue* const outer = running_queue;
  running_queue = q;
  const int64_t start = NowNs();
  std::move(task)(parallel, cancelled);  // destroys the task (and what it holds) too
  const int64_t elapsed = NowNs() - start - parallel.wait_ns();
  running_queue = outer;
  mu_.Lock();
  ChargeLocked(q, elapsed);
  q->stream_busy_[stream] = false;
  --q->running_;
  --active_;
  ReapLocked(q);
}

void CpuScheduler::Retire(CpuTenantQueue* q) {
  std::vector<CpuTenantQueue::Task> cancelled;
  const bool from_own_task = running_queue == q;
  {
    absl::MutexLock lock(&mu_);
    q->removed_ = true;
    q->orphaned_ = from_own_task;
    for (auto& stream : q->streams_) {
      for (auto& task : stream) cancelled.push_back(std::move(task));
      stream.clear();
    }
    q->queued_ = 0;
  }
  kernels::SerialParallel serial;
  for (auto& task : cancelled) std::move(task)(serial, /*cancelled=*/true);
  // Released from inside one of its own tasks: that task is still running on this thread,
  // so the worker deletes the queue when it returns (ReapLocked).
  if (from_own_task) return;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](CpuTenantQueue* t) { return t->running_ == 0; }, q));
    tenants_.remove(q);
  }
  delete q;
}

void CpuScheduler::ReapLocked(CpuTenantQueue* q) {
  if (!q->orphaned_ || q->running_ != 0) return;
  tenants_.remove(q);
  delete q;
}

}  // namespace tessera
