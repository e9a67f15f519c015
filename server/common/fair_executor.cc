#include "server/common/fair_executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

#include "server/common/telemetry.h"

namespace tessera {
namespace {

// A queue drains at the threads' pace (a 1 MiB chunk copies in well under a millisecond; the
// executor also runs kernel commits), so a short wait is enough; the client is told so.
constexpr int64_t kRetryAfterMs = 50;

absl::Status Refusal(std::string message) {
  return telemetry::WithRetryAfterMs(
      telemetry::WithRefusalReason(absl::ResourceExhaustedError(std::move(message)),
                                   "transfer_queue"),
      kRetryAfterMs);
}

}  // namespace

FairExecutor::FairExecutor(std::string name, size_t max_pending, size_t max_pending_per_key,
                           int threads)
    : name_(std::move(name)), max_pending_(max_pending), max_pending_per_key_(max_pending_per_key) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

FairExecutor::~FairExecutor() { Stop(); }

absl::Status FairExecutor::Schedule(absl::string_view key, double weight,
                                    absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError(absl::StrCat(name_, " is shutting down"));
  if (pending_ >= max_pending_) {
    return Refusal(absl::StrCat(name_, " queue is full (", max_pending_, " pending); retry in ",
                                kRetryAfterMs, " ms"));
  }
  auto [it, inserted] = queues_.try_emplace(key);
  Queue& queue = it->second;
  if (queue.tasks.size() >= max_pending_per_key_) {
    return Refusal(absl::StrCat(name_, " queue of \"", key, "\" is full (", max_pending_per_key_,
                                " pending); retry in ", kRetryAfterMs, " ms"));
  }
  queue.weight = weight > 0 ? weight : 1;
  if (inserted || (queue.tasks.empty() && queue.running == 0)) {
    queue.virtual_start = std::max(queue.virtual_start, virtual_time_);  // no saved-up credit
  }
  queue.tasks.push_back(std::move(task));
  ++pending_;
  return absl::OkStatus();
}

void FairExecutor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

size_t FairExecutor::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

bool FairExecutor::HasWorkOrStopping() const { return stopping_ || pending_ > 0; }

void FairExecutor::Loop() {
  for (;;) {
    absl::AnyInvocable<void() &&> task;
    std::string key;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &FairExecutor::HasWorkOrStopping));
      if (pending_ == 0) return;  // stopping and drained
      // The waiting key with the earliest virtual start; ties go to the one with fewer tasks
      // running. Linear in the keys with work, which admission bounds (tenants).
      auto best = queues_.end();
      for (auto it = queues_.begin(); it != queues_.end(); ++it) {
        const Queue& q = it->second;
        if (q.tasks.empty()) continue;
        if (best == queues_.end() || q.virtual_start < best->second.virtual_start ||
            (q.virtual_start == best->second.virtual_start && q.running < best->second.running)) {
          best = it;
        }
      }
      Queue& queue = best->second;
      task = std::move(queue.tasks.front());
      queue.tasks.pop_front();
      --pending_;
      ++queue.running;
      virtual_time_ = std::max(virtual_time_, queue.virtual_start);
      queue.virtual_start += 1.0 / queue.weight;
      key = best->first;
    }
    std::move(task)();
    task = nullptr;  // destroy what it captured before the key can be forgotten
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(key);
    if (it != queues_.end() && --it->second.running == 0 && it->second.tasks.empty()) {
      queues_.erase(it);
    }
  }
}

}  // namespace tessera
