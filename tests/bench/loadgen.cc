#include "tests/bench/loadgen.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace tessera::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start, Clock::time_point t) {
  return std::chrono::duration<double>(t - start).count();
}

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

LoadResult RunLoad(const LoadOptions& options, const Call& call) {
  const int workers = std::max(1, options.workers);
  const double duration = absl::ToDoubleSeconds(options.duration);
  LoadResult result;
  result.latency.resize(static_cast<size_t>(workers));
  result.errors.assign(static_cast<size_t>(workers), 0);
  std::atomic<int64_t> started{0};
  std::atomic<int64_t> next_arrival{0};
  std::vector<double> last_end(static_cast<size_t>(workers), 0);  // each written by its worker
  const Clock::time_point start = Clock::now();
  auto body = [&](int w) {
    for (;;) {
      Clock::time_point scheduled;
      if (options.rate > 0) {
        int64_t k = next_arrival.fetch_add(1);
        double at = static_cast<double>(k) / options.rate;
        if (at >= duration) return;
        scheduled =
            start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at));
        std::this_thread::sleep_until(scheduled);
      } else {
        scheduled = Clock::now();
        if (Since(start, scheduled) >= duration) return;
      }
      if (started.fetch_add(1) >= options.max_calls) return;
      bool ok = call(w);
      Clock::time_point end = Clock::now();
      if (ok) {
        result.latency[static_cast<size_t>(w)].push_back(Since(scheduled, end));
      } else {
        result.errors[static_cast<size_t>(w)]++;
      }
      last_end[static_cast<size_t>(w)] = Since(start, end);
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(body, w);
  for (std::thread& t : threads) t.join();
  result.seconds = *std::max_element(last_end.begin(), last_end.end());
  return result;
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
