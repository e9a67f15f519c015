#ifndef TESSERA_TESTS_BENCH_LOADGEN_H_
#define TESSERA_TESTS_BENCH_LOADGEN_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "absl/time/time.h"

namespace tessera::bench {

/// One request issued by worker `worker` (0..workers-1); false when it failed.
using Call = std::function<bool(int worker)>;

struct LoadOptions {
  /// Requests in flight at most: one thread each, so a worker's calls are sequential.
  int workers = 1;
  /// Always bounded: no request starts after this.
  absl::Duration duration = absl::Seconds(1);
  /// Bound on the number of requests started, across workers.
  int64_t max_calls = std::numeric_limits<int64_t>::max();
  /// 0: closed loop (each worker issues its next request when the last returns). > 0: open
  /// loop at this many arrivals per second, evenly spaced; a request's latency counts from
  /// its scheduled arrival, so time spent waiting for a free worker is included (no
  /// coordinated omission).
  double rate = 0;
};

struct LoadResult {
  /// Per worker: latency of each successful call, seconds, in completion order.
  std::vector<std::vector<double>> latency;
  std::vector<int64_t> errors;
  double seconds = 0;  // wall time from the start to the last completion

  int64_t Ok() const;
  int64_t Errors() const;
  double Qps() const { return seconds > 0 ? static_cast<double>(Ok()) / seconds : 0; }
  /// Every worker's latencies together.
  std::vector<double> All() const;
};

/// Runs `call` under the load `options` describes, on `options.workers` threads.
LoadResult RunLoad(const LoadOptions& options, const Call& call);

/// The p-th quantile (0..1) of `v` (nearest rank); 0 when empty.
double Percentile(std::vector<double> v, double p);
/// Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes everything.
double JainIndex(const std::vector<double>& x);

}  // namespace tessera::bench

#endif  // TESSERA_TESTS_BENCH_LOADGEN_H_
