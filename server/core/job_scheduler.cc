#include "server/core/job_scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

std::shared_ptr<JobScheduler> JobScheduler::Create(Options options) {
  std::shared_ptr<JobScheduler> scheduler(new JobScheduler(std::move(options)));
  scheduler->timer_->scheduler = scheduler;
  scheduler->deadline_thread_ = std::thread(&JobScheduler::DeadlineLoop, scheduler->timer_);
  return scheduler;
}

JobScheduler::JobScheduler(Options options)
    : options_(std::move(options)), device_in_flight_(options_.device_in_flight.size(), 0) {}

JobScheduler::~JobScheduler() { Stop(); }

void JobScheduler::Stop() {
  {
    absl::MutexLock lock(&timer_->mu);
    timer_->stopping = true;
    timer_->changed.Signal();
  }
  if (!deadline_thread_.joinable()) return;
  if (deadline_thread_.get_id() == std::this_thread::get_id()) {
    deadline_thread_.detach();  // destroyed by a callback on the deadline thread: it exits
  } else {
    deadline_thread_.join();
  }
}

void JobScheduler::DeadlineLoop(std::shared_ptr<Timer> timer) {
  for (;;) {
    {
      absl::MutexLock lock(&timer->mu);
      while (!timer->stopping && absl::Now() < timer->next) {
        timer->changed.WaitWithDeadline(&timer->mu, timer->next);
      }
      if (timer->stopping) return;
      timer->next = absl::InfiniteFuture();  // Dispatch's expiry scan sets the next one
    }
    if (std::shared_ptr<JobScheduler> scheduler = timer->scheduler.lock()) {
      scheduler->Dispatch();
    }
  }
}

void JobScheduler::NoteDeadlineLocked(absl::Time deadline) {
  if (deadline >= next_deadline_) return;
  next_deadline_ = deadline;
  absl::MutexLock lock(&timer_->mu);
  if (deadline < timer_->next) {
    timer_->next = deadline;
    timer_->changed.Signal();
  }
}

std::shared_ptr<JobScheduler::Queue> JobScheduler::AddTenant(int device, const Quota& quota,
                                                             std::shared_ptr<MemoryLedger> ledger) {
  std::shared_ptr<Queue> queue(new Queue(shared_from_this(), device, quota, std::move(ledger)));
  absl::MutexLock lock(&mu_);
  queues_.push_back(queue.get());
  return queue;
}

int JobScheduler::in_flight(int device) const {
  absl::MutexLock lock(&mu_);
  return device_in_flight_.at(static_cast<size_t>(device));
}

void JobScheduler::Dispatch() {
  {
    absl::MutexLock lock(&mu_);
    if (dispatching_) {
      again_ = true;  // the running dispatch goes round again
      return;
    }
    dispatching_ = true;
  }
  // One dispatcher at a time releases in order, so a stream's jobs reach the backend in
  // queue order even when several threads complete and submit at once.
  for (;;) {
    std::vector<Action> actions;
    {
      absl::MutexLock lock(&mu_);
      again_ = false;
      CollectLocked(actions);
      if (actions.empty() && !again_) {
        dispatching_ = false;
        return;
      }
    }
    for (Action& a : actions) {
      if (a.drop.ok()) {
        std::move(a.ticket->release)(std::move(a.scratch));
      } else {
        std::move(a.ticket->drop)(a.drop);
      }
    }
  }
}

void JobScheduler::ExpireLocked(absl::Time now, std::vector<Action>& actions) {
  next_deadline_ = absl::InfiniteFuture();
  absl::Time next = absl::InfiniteFuture();
  for (Queue* q : queues_) {
    for (auto& stream : q->streams_) {
      for (auto it = stream.begin(); it != stream.end();) {
        if (it->ticket->deadline <= now) {
          actions.push_back(
              Action{std::move(it->ticket), MemoryCharge(),
                     absl::DeadlineExceededError(
                         "the job's deadline passed while it was queued; it did not run")});
          --q->queued_;
          it = stream.erase(it);
        } else {
          next = std::min(next, it->ticket->deadline);
          ++it;
        }
      }
    }
  }
  if (next != absl::InfiniteFuture()) NoteDeadlineLocked(next);
}

bool JobScheduler::ReleasableLocked(const Queue& q, int stream) const {
  return !q.streams_[static_cast<size_t>(stream)].empty() &&
         q.stream_in_flight_[static_cast<size_t>(stream)] < options_.stream_in_flight;
}

JobScheduler::Queue* JobScheduler::PickLocked(int device) {
  const int cap = options_.device_in_flight.at(static_cast<size_t>(device));
  if (cap > 0 && device_in_flight_[static_cast<size_t>(device)] >= cap) return nullptr;
  Queue* best = nullptr;
  for (Queue* q : queues_) {
    if (q->device_ != device || q->closed_ || q->queued_ == 0 || q->memory_blocked_) continue;
    bool releasable = false;
    for (size_t s = 0; s < q->streams_.size() && !releasable; ++s) {
      releasable = ReleasableLocked(*q, static_cast<int>(s));
    }
    if (!releasable) continue;
    if (best == nullptr || q->priority_ < best->priority_ ||
        (q->priority_ == best->priority_ && q->virtual_time_ < best->virtual_time_)) {
      best = q;
    }
  }
  return best;
}

void JobScheduler::CollectLocked(std::vector<Action>& actions) {
  const absl::Time now = absl::Now();
  if (now >= next_deadline_) ExpireLocked(now, actions);
  for (size_t device = 0; device < device_in_flight_.size(); ++device) {
    while (Queue* q = PickLocked(static_cast<int>(device))) {
      // The tenant's next releasable stream, round-robin.
      const size_t count = q->streams_.size();
      size_t stream = 0;
      for (size_t i = 0; i < count; ++i) {
        size_t s = (q->next_stream_ + i) % count;
        if (ReleasableLocked(*q, static_cast<int>(s))) {
          stream = s;
          break;
        }
      }
      std::deque<Waiting>& fifo = q->streams_[stream];
      Waiting& head = fifo.front();
      MemoryCharge scratch;
      if (head.ticket->scratch_bytes > 0) {
        absl::StatusOr<MemoryCharge> charge = q->ledger_->Reserve(
            MemoryUse::kScratch, head.ticket->scratch_bytes, "of scratch for the next job");
        if (!charge.ok()) {
          if (q->in_flight_ > 0) {  // running jobs hold scratch: wait for one to complete
            q->memory_blocked_ = true;
            continue;
          }
          actions.push_back(Action{std::move(head.ticket), MemoryCharge(), charge.status()});
          fifo.pop_front();
          --q->queued_;
          continue;
        }
        scratch = *std::move(charge);
      }
      q->next_stream_ = (stream + 1) % count;
      actions.push_back(Action{std::move(head.ticket), std::move(scratch), absl::OkStatus()});
      fifo.pop_front();
      --q->queued_;
      ++q->in_flight_;
      ++q->stream_in_flight_[stream];
      ++device_in_flight_[device];
    }
  }
}

// ---- Queue -------------------------------------------------------------------------------------

JobScheduler::Queue::Queue(std::shared_ptr<JobScheduler> scheduler, int device, const Quota& quota,
                           std::shared_ptr<MemoryLedger> ledger)
    : scheduler_(std::move(scheduler)),
      device_(device),
      weight_(std::max<uint32_t>(1, quota.compute_share_percent)),
      priority_(quota.priority),
      ledger_(std::move(ledger)),
      streams_(std::max<size_t>(1, quota.max_streams)),
      stream_in_flight_(streams_.size(), 0) {}

JobScheduler::Queue::~Queue() {
  absl::MutexLock lock(&scheduler_->mu_);
  scheduler_->queues_.remove(this);
}

uint64_t JobScheduler::Queue::Enqueue(std::unique_ptr<JobTicket> ticket) {
  JobScheduler& s = *scheduler_;
  absl::MutexLock lock(&s.mu_);
  const uint64_t id = ++s.next_id_;
  if (queued_ == 0 && in_flight_ == 0) {
    // Waking from idle: start at the least virtual time among the device's busy tenants, so
    // time spent idle is not banked as credit.
    double floor = std::numeric_limits<double>::infinity();
    for (Queue* other : s.queues_) {
      if (other != this && other->device_ == device_ &&
          (other->queued_ > 0 || other->in_flight_ > 0)) {
        floor = std::min(floor, other->virtual_time_);
      }
    }
    if (floor != std::numeric_limits<double>::infinity()) {
      virtual_time_ = std::max(virtual_time_, floor);
    }
  }
  if (ticket->deadline != absl::InfiniteFuture()) s.NoteDeadlineLocked(ticket->deadline);
  const size_t stream = static_cast<size_t>(ticket->stream) % streams_.size();
  streams_[stream].push_back(Waiting{id, std::move(ticket)});
  ++queued_;
  return id;
}

bool JobScheduler::Queue::Cancel(uint64_t id) {
  std::unique_ptr<JobTicket> removed;  // destroyed after the lock is released
  absl::MutexLock lock(&scheduler_->mu_);
  for (auto& stream : streams_) {
    for (auto it = stream.begin(); it != stream.end(); ++it) {
      if (it->id == id) {
        removed = std::move(it->ticket);
        stream.erase(it);
        --queued_;
        return true;
      }
    }
  }
  return false;
}

std::vector<uint64_t> JobScheduler::Queue::TakeAll() {
  std::vector<std::unique_ptr<JobTicket>> removed;
  std::vector<uint64_t> ids;
  absl::MutexLock lock(&scheduler_->mu_);
  for (auto& stream : streams_) {
    for (Waiting& w : stream) {
      ids.push_back(w.id);
      removed.push_back(std::move(w.ticket));
    }
    stream.clear();
  }
  queued_ = 0;
  return ids;
}

std::vector<uint64_t> JobScheduler::Queue::Close() {
  std::vector<uint64_t> ids = TakeAll();
  absl::MutexLock lock(&scheduler_->mu_);
  closed_ = true;
  return ids;
}

void JobScheduler::Queue::Completed(int stream, absl::Duration run_time) {
  {
    absl::MutexLock lock(&scheduler_->mu_);
    const size_t s = static_cast<size_t>(stream) % streams_.size();
    --stream_in_flight_[s];
    --in_flight_;
    --scheduler_->device_in_flight_[static_cast<size_t>(device_)];
    memory_blocked_ = false;
    virtual_time_ += absl::ToDoubleNanoseconds(run_time) * 100.0 / weight_;
  }
  scheduler_->Dispatch();
}

int64_t JobScheduler::Queue::queued() const {
  absl::MutexLock lock(&scheduler_->mu_);
  return queued_;
}

}  // namespace tessera
