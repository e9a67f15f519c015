#ifndef TESSERA_TESTS_BENCH_LOADGEN_H_
#define TESSERA_TESTS_BENCH_LOADGEN_H_

// The benchmarks' one load generator: calls are started through an asynchronous interface
// (gRPC's callback API in the suite), so one client thread keeps any number of calls in
// flight and the client costs the machine as little as the best gRPC client would. Every
// scenario drives Tessera and its baseline through it.
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "absl/time/time.h"

namespace tessera::bench {

/// Reports the end of one call: true when it succeeded. Called exactly once, from any thread.
using Done = std::function<void(bool ok)>;
/// Starts one call for slot `slot` (0..slots-1; a slot has one call in flight at a time) and
/// returns without waiting; `done` is called when the call ends. Must not block.
using AsyncCall = std::function<void(int slot, Done done)>;

struct LoadOptions {
  /// Calls in flight at most (slots), all started from the completions of earlier ones: no
  /// thread per call.
  int workers = 1;
  /// Always bounded: no request starts after this.
  absl::Duration duration = absl::Seconds(1);
  /// Bound on the number of requests started, across slots.
  int64_t max_calls = std::numeric_limits<int64_t>::max();
  /// 0: closed loop (each slot starts its next call when the last ends). > 0: open loop at
  /// this many arrivals per second, evenly spaced; a request's latency counts from its
  /// scheduled arrival, so time spent waiting for a free slot is included (no coordinated
  /// omission).
  double rate = 0;
};

struct LoadResult {
  /// Per slot: latency of each successful call, seconds, in completion order.
  std::vector<std::vector<double>> latency;
  std::vector<int64_t> errors;
  double seconds = 0;  // wall time from the start to the last completion

  int64_t Ok() const;
  int64_t Errors() const;
  double Qps() const { return seconds > 0 ? static_cast<double>(Ok()) / seconds : 0; }
  /// Every slot's latencies together.
  std::vector<double> All() const;
};

/// Runs `call` under the load `options` describes and returns when every call has ended.
LoadResult RunLoad(const LoadOptions& options, const AsyncCall& call);

/// Starts one call on slot `slot` and waits for it: its latency in seconds, or a negative
/// number when it failed.
double TimeOneCall(const AsyncCall& call, int slot = 0);

/// An AsyncCall made of a blocking one, each call on a thread of its own (for tests of the
/// generator itself; never for measurements).
AsyncCall OnThreads(std::function<bool(int slot)> blocking);

/// The p-th quantile (0..1) of `v` (nearest rank); 0 when empty.
double Percentile(std::vector<double> v, double p);
/// Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes everything.
double JainIndex(const std::vector<double>& x);

}  // namespace tessera::bench

#endif  // TESSERA_TESTS_BENCH_LOADGEN_H_
