#ifndef TESSERA_TESTS_TESTING_SLOW_WORK_H_
#define TESSERA_TESTS_TESTING_SLOW_WORK_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "tessera/client.h"

namespace tessera::testing {

/// A job that keeps a stream busy for about a given time on whatever backend serves it: a
/// program of square f32 matmuls whose size is measured on the server under test. A fixed
/// workload cannot do this: what takes the CPU backend two seconds an H100 finishes in a few
/// milliseconds, and the tests that need work to wait behind other work then see none wait.
class SlowWork {
 public:
  /// Measures on `client`'s tenant, growing the operand until `steps` (at most 256) of them
  /// last `duration`; the operands (2 n² f32) stay within `max_bytes` of the tenant's memory.
  static absl::StatusOr<SlowWork> Calibrate(Client& client, absl::Duration duration,
                                            uint64_t max_bytes) {
    const int64_t max_n = std::max<int64_t>(
        64, static_cast<int64_t>(std::sqrt(static_cast<double>(max_bytes) / 8)) / 64 * 64);
    // 256: a smaller matmul is over in well under a millisecond on any backend, so its time
    // is the machine's scheduling more than its work.
    int64_t n = std::min<int64_t>(max_n, 256);
    int jobs = 0;
    // The previous round's operand and time per step: a step's time counts only once it
    // follows the work (n³), not the machine's scheduling. On a loaded machine a small
    // matmul waits milliseconds for a core and looks as slow as a large one; taken at its
    // word it would give a blocker that finishes at once when the load goes away.
    int64_t last_n = 0;
    double last_measured = 0;
    for (int round = 0;; ++round) {
      absl::StatusOr<SlowWork> work = ForTenant(client, n, kFirstSteps);
      if (!work.ok()) return work.status();
      jobs += 2 * (1 + kRuns);
      work->calibration_jobs_ = jobs;
      absl::StatusOr<absl::Duration> per_step = work->TimeSteps(client);
      if (!per_step.ok()) return per_step.status();
      const double wanted = absl::ToDoubleSeconds(duration) / kMaxSteps;
      const double measured = std::max(absl::ToDoubleSeconds(*per_step), 1e-7);
      // A step's time grows as n³ once the fixed cost of a call is small beside it; grow by
      // at most 4x a round, since that cost hides how much faster the device really is, and
      // no further than keeps the next round's longest call (2k steps) within a second.
      const double affordable = std::cbrt(1.0 / (2 * kFirstSteps * measured));
      const double growth =
          std::min(std::clamp(std::cbrt(wanted / measured), 1.25, 4.0), affordable);
      const bool follows_the_work =
          last_n > 0 && measured / last_measured >=
                            0.5 * std::pow(static_cast<double>(n) / static_cast<double>(last_n), 3);
      if ((measured >= wanted && follows_the_work) || n >= max_n || round == 6 || growth < 1.25) {
        work->steps_ = static_cast<int>(std::clamp<double>(
            std::ceil(absl::ToDoubleSeconds(duration) / measured), 1, kMaxSteps));
        work->per_step_ = *per_step;
        std::printf("slow work for %s: %s\n", absl::FormatDuration(duration).c_str(),
                    work->Describe().c_str());
        return work;
      }
      work->Release(client);
      last_n = n;
      last_measured = measured;
      n = std::min(max_n, (static_cast<int64_t>(static_cast<double>(n) * growth) + 63) / 64 * 64);
    }
  }

  /// The same work for another tenant: operands of its own, `n` and `steps` as measured.
  static absl::StatusOr<SlowWork> ForTenant(Client& client, int64_t n, int steps) {
    v1::TensorSpec spec;
    spec.set_dtype(v1::DTYPE_F32);
    spec.add_shape(n);
    spec.add_shape(n);
    SlowWork work;
    work.n_ = n;
    work.steps_ = steps;
    absl::StatusOr<v1::TensorInfo> a = client.CreateTensor(spec);
    if (!a.ok()) return a.status();
    work.a_ = a->handle();
    absl::StatusOr<v1::TensorInfo> out = client.CreateTensor(spec);
    if (!out.ok()) return out.status();
    work.out_ = out->handle();
    return work;
  }

  /// The program: `steps` times out = a @ a.
  v1::SubmitRequest Program(uint32_t stream = 0, bool wait = false) const {
    v1::SubmitRequest request;
    request.set_stream(stream);
    request.set_wait(wait);
    for (int i = 0; i < steps_; ++i) {
      v1::ProgramStep* step = request.add_steps();
      step->set_kernel("matmul");
      step->add_inputs()->set_handle(a_);
      step->add_inputs()->set_handle(a_);
      step->add_outputs()->set_handle(out_);
    }
    return request;
  }

  void Release(Client& client) const {
    (void)client.DeleteTensor(a_);
    (void)client.DeleteTensor(out_);
  }

  int64_t n() const { return n_; }
  int steps() const { return steps_; }
  const std::string& operand() const { return a_; }
  /// The jobs that Calibrate ran on the tenant (all succeeded), for tests that count jobs.
  uint64_t calibration_jobs() const { return static_cast<uint64_t>(calibration_jobs_); }
  std::string Describe() const {
    return absl::StrCat(steps_, " matmuls of ", n_, "x", n_, " f32, ",
                        absl::FormatDuration(per_step_), " each");
  }

 private:
  static constexpr int kMaxSteps = 256;  // a program's steps
  static constexpr int kRuns = 2;        // timed runs of each program
  static constexpr int kFirstSteps = 8;  // the shorter program timed (the longer: twice it)

  // The time of one step, without the call's own cost (a round trip that dwarfs a small
  // matmul on a GPU): a program of 2k steps against one of k, each the fastest of two runs
  // after a warm-up (a busy machine only ever makes a run slower).
  absl::StatusOr<absl::Duration> TimeSteps(Client& client) {
    auto run = [&](int steps) -> absl::StatusOr<absl::Duration> {
      steps_ = steps;
      absl::Duration fastest = absl::InfiniteDuration();
      for (int i = 0; i < 1 + kRuns; ++i) {
        const absl::Time start = absl::Now();
        absl::StatusOr<v1::Job> job = client.Submit(Program(0, /*wait=*/true));
        if (!job.ok()) return job.status();
        if (job->state() != v1::JOB_STATE_SUCCEEDED) {
          return absl::InternalError(absl::StrCat("calibration job: ", job->error_message()));
        }
        if (i == 0) continue;
        // The server's own account of the run (release to completion) where it gives one:
        // it leaves out the call's cost, which on a loaded machine can exceed a small
        // program's whole run and would make the operands look far slower than they are.
        const absl::Duration wall = absl::Now() - start;
        const absl::Duration ran = JobRunTime(*job).value_or(wall);
        fastest = std::min(fastest, ran > absl::ZeroDuration() ? std::min(ran, wall) : wall);
      }
      return fastest;
    };
    const int k = steps_;
    absl::StatusOr<absl::Duration> few = run(k);
    if (!few.ok()) return few.status();
    absl::StatusOr<absl::Duration> more = run(2 * k);
    if (!more.ok()) return more.status();
    steps_ = k;
    // On a busy machine the difference can come out near zero, which would grow the next
    // round's operands without bound; a quarter of the longer program's run time per step
    // is a floor that keeps it honest.
    return std::max((*more - *few) / k, *more / (4 * 2 * k));
  }

  std::string a_, out_;
  int64_t n_ = 0;
  int steps_ = 0;
  int calibration_jobs_ = 0;
  absl::Duration per_step_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_SLOW_WORK_H_
