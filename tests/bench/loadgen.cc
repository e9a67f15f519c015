#include "tests/bench/loadgen.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"

namespace tessera::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start, Clock::time_point t) {
  return std::chrono::duration<double>(t - start).count();
}

// One run: slots start calls from the completions of their previous ones (closed loop) or
// take the arrivals a pacing thread schedules (open loop).
class Run : public std::enable_shared_from_this<Run> {
 public:
  Run(const LoadOptions& options, const AsyncCall& call)
      : options_(options),
        call_(call),
        slots_(std::max(1, options.workers)),
        duration_(absl::ToDoubleSeconds(options.duration)) {
    result_.latency.resize(static_cast<size_t>(slots_));
    result_.errors.assign(static_cast<size_t>(slots_), 0);
  }

  LoadResult Go() {
    start_ = Clock::now();
    live_slots_ = slots_;
    if (options_.rate <= 0) {
      for (int s = 0; s < slots_; ++s) Next(s);
    } else {
      Pace();
    }
    all_ended_.WaitForNotification();
    std::lock_guard<std::mutex> lock(mu_);
    result_.seconds = last_end_;
    return std::move(result_);
  }

 private:
  // Closed loop: the slot's next call, or the slot's end.
  void Next(int slot) {
    const Clock::time_point now = Clock::now();
    if (Since(start_, now) >= duration_ || started_.fetch_add(1) >= options_.max_calls) {
      EndSlot();
      return;
    }
    Start(slot, now);
  }

  void Start(int slot, Clock::time_point scheduled) {
    // A call that ends inside call_() (a failure at once) would start the next one on this
    // stack; past a small depth the next start goes to a thread of its own instead.
    thread_local int depth = 0;
    ++depth;
    auto self = shared_from_this();
    call_(slot, [self, slot, scheduled](bool ok) {
      const Clock::time_point end = Clock::now();
      self->Record(slot, ok, scheduled, end);
      if (depth > 16) {
        std::thread([self, slot] { self->AfterCall(slot); }).detach();
      } else {
        self->AfterCall(slot);
      }
    });
    --depth;
  }

  void Record(int slot, bool ok, Clock::time_point scheduled, Clock::time_point end) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ok) {
      result_.latency[static_cast<size_t>(slot)].push_back(Since(scheduled, end));
    } else {
      result_.errors[static_cast<size_t>(slot)]++;
    }
    last_end_ = std::max(last_end_, Since(start_, end));
  }

  void AfterCall(int slot) {
    if (options_.rate <= 0) {
      Next(slot);
      return;
    }
    Clock::time_point scheduled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (backlog_.empty()) {
        free_.push_back(slot);
        if (pacing_done_ && free_.size() == static_cast<size_t>(slots_)) Finish();
        return;
      }
      scheduled = backlog_.front();
      backlog_.pop_front();
    }
    Start(slot, scheduled);
  }

  // Open loop: arrivals at k / rate, each on a free slot or queued for the next one to free.
  void Pace() {
    for (int s = 0; s < slots_; ++s) free_.push_back(s);
    for (int64_t k = 0; k < options_.max_calls; ++k) {
      const double at = static_cast<double>(k) / options_.rate;
      if (at >= duration_) break;
      const Clock::time_point scheduled =
          start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at));
      std::this_thread::sleep_until(scheduled);
      int slot = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (free_.empty()) {
          backlog_.push_back(scheduled);
          continue;
        }
        slot = free_.back();
        free_.pop_back();
      }
      Start(slot, scheduled);
    }
    std::lock_guard<std::mutex> lock(mu_);
    pacing_done_ = true;
    if (free_.size() == static_cast<size_t>(slots_)) Finish();
  }

  void EndSlot() {
    if (live_slots_.fetch_sub(1) == 1) all_ended_.Notify();
  }
  void Finish() {  // open loop, mu_ held: every slot free and no arrival left
    if (!all_ended_.HasBeenNotified()) all_ended_.Notify();
  }

  const LoadOptions options_;
  const AsyncCall call_;
  const int slots_;
  const double duration_;
  Clock::time_point start_;
  std::atomic<int64_t> started_{0};
  std::atomic<int> live_slots_{0};
  absl::Notification all_ended_;
  std::mutex mu_;
  LoadResult result_;
  double last_end_ = 0;
  std::deque<Clock::time_point> backlog_;
  std::vector<int> free_;
  bool pacing_done_ = false;
};

}  // namespace

int64_t LoadResult::Ok() const {
  int64_t n = 0;
  for (const auto& w : latency) n += static_cast<int64_t>(w.size());
  return n;
}

int64_t LoadResult::Errors() const {
  int64_t n = 0;
  for (int64_t e : errors) n += e;
  return n;
}

std::vector<double> LoadResult::All() const {
  std::vector<double> all;
  for (const auto& w : latency) all.insert(all.end(), w.begin(), w.end());
  return all;
}

LoadResult RunLoad(const LoadOptions& options, const AsyncCall& call) {
  return std::make_shared<Run>(options, call)->Go();
}

double TimeOneCall(const AsyncCall& call, int slot) {
  absl::Notification ended;
  bool succeeded = false;
  const Clock::time_point start = Clock::now();
  Clock::time_point end;
  call(slot, [&](bool ok) {
    end = Clock::now();
    succeeded = ok;
    ended.Notify();
  });
  ended.WaitForNotification();
  return succeeded ? Since(start, end) : -1;
}

AsyncCall OnThreads(std::function<bool(int slot)> blocking) {
  return [blocking = std::move(blocking)](int slot, Done done) {
    std::thread([blocking, slot, done = std::move(done)] { done(blocking(slot)); }).detach();
  };
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(p * static_cast<double>(v.size()));
  return v[std::min(v.size() - 1, rank)];
}

double JainIndex(const std::vector<double>& x) {
  double sum = 0, squares = 0;
  for (double v : x) {
    sum += v;
    squares += v * v;
  }
  return squares > 0 ? sum * sum / (static_cast<double>(x.size()) * squares) : 1.0;
}

}  // namespace tessera::bench
