#ifndef TESSERA_KERNELS_CPU_PARALLEL_H_
#define TESSERA_KERNELS_CPU_PARALLEL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace tessera::kernels {

/// How a CPU kernel spreads work. Kernels only split; the CPU backend's scheduler decides
/// which worker runs which chunk (and charges the time to the tenant).
class Parallel {
 public:
  virtual ~Parallel() = default;
  /// Calls `body(begin, end)` on disjoint chunks covering [0, n), each starting at a
  /// multiple of `grain` and at most `grain` long, possibly concurrently; returns when every
  /// chunk has finished. `grain` >= 1. Does nothing for n <= 0.
  virtual void For(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> body) = 0;
  /// Workers that may run chunks at once (sizing hint for kernels).
  virtual int Concurrency() const = 0;
  /// The threads this task may use by itself, through a library's own threading, right now:
  /// Concurrency() when nothing else runs or waits, else 1. A hint for work that a
  /// multi-threaded library call does better than chunks (small matrix products).
  virtual int AloneConcurrency() const { return 1; }
};

/// Runs every chunk on the calling thread, in order.
class SerialParallel final : public Parallel {
 public:
  void For(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> body) override {
    for (int64_t begin = 0; begin < n; begin += grain) body(begin, std::min(n, begin + grain));
  }
  int Concurrency() const override { return 1; }
};

}  // namespace tessera::kernels

#endif  // TESSERA_KERNELS_CPU_PARALLEL_H_
