// The host's cost per job below gRPC: TenantRuntime::Submit of a 4 KiB add, waiting for each
// job, on the CPU backend or the CUDA module (on a GPU, or on the fake driver, where only the
// host path is real), against a bare GetUsage call on the same runtime. For the CUDA backend
// it also reports the host CPU time per job (the submitting thread plus the completion
// thread; the fake driver's stream threads stand in for the GPU and are left out) and the
// completion thread's CPU share while jobs run and while none does. docs/benchmarks.md,
// "Host work per job".
//
// Usage: tessera_submit_bench [--backend=cpu|cuda] [--completion=spin|host_function]
//                             [--single_launch_graphs] [--jobs=N]
//                             [--elements=N (of the f32 add; 1024)]
//   On the fake driver: LD_LIBRARY_PATH=build/tests/fake_cuda tessera_submit_bench --backend=cuda
//   Profile: valgrind --tool=callgrind tessera_submit_bench --jobs=2000
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"

#include "server/backend/select.h"
#include "server/core/tenant_runtime.h"
#include "tests/testing/thread_clock.h"

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  std::string backend_name = "cpu", completion = "spin";
  bool single_launch_graphs = false;
  int jobs = 20000;
  int64_t elements = 1024;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--backend=")) {
      backend_name = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--completion=")) {
      completion = std::string(arg);
    } else if (arg == "--single_launch_graphs") {
      single_launch_graphs = true;
    } else if (absl::ConsumePrefix(&arg, "--jobs=") && absl::SimpleAtoi(arg, &jobs) && jobs > 0) {
    } else if (absl::ConsumePrefix(&arg, "--elements=") && absl::SimpleAtoi(arg, &elements) &&
               elements > 0) {
    } else {
      std::fprintf(stderr,
                   "usage: tessera_submit_bench [--backend=cpu|cuda] "
                   "[--completion=spin|host_function] [--single_launch_graphs] [--jobs=N] "
                   "[--elements=N]\n");
      return 2;
    }
  }
  absl::StatusOr<BackendChoice> choice =
      SelectBackend({.backend = backend_name,
                     .mps = "off",
                     .cpu_memory_bytes = uint64_t{1} << 30,
                     .cpu_threads = 2,
                     .cuda_completion = completion,
                     .cuda_single_launch_graphs = single_launch_graphs});
  if (!choice.ok()) {
    std::fprintf(stderr, "%s\n", std::string(choice.status().message()).c_str());
    return 1;
  }
  Backend& backend = *choice->backend;
  Quota quota{.device_memory_bytes = 64 << 20,
              .compute_share_percent = 100,
              .max_streams = 4,
              .max_queued_jobs = 1024,
              .priority = Priority::kNormal};
  auto context = backend.CreateContext({"bench", quota, 0});
  if (!context.ok()) {
    std::fprintf(stderr, "%s\n", std::string(context.status().message()).c_str());
    return 1;
  }
  auto runtime = std::make_shared<TenantRuntime>("bench", quota, *std::move(context));
  auto a = *runtime->CreateTensor({kernels::DType::kF32, {elements}}, "");
  auto c = *runtime->CreateTensor({kernels::DType::kF32, {elements}}, "");
  LaunchSpec add;
  add.kernel = "add";
  add.inputs = {Operand{a.handle}, Operand{a.handle}};
  add.outputs = {OutputSpec{OutputSpec::Kind::kHandle, c.handle, {}}};
  auto submit_and_wait = [&] {
    absl::Notification done;  // attached before enqueue, as the Compute service does
    (void)runtime->Submit(0, {add}, false, [&](const JobInfo&) { done.Notify(); });
    done.WaitForNotification();
  };
  for (int i = 0; i < 100; ++i) submit_and_wait();  // warm-up: kernels loaded, events made

  const auto usage_start = Clock::now();
  for (int i = 0; i < jobs; ++i) (void)runtime->Usage();
  const double usage_us =
      std::chrono::duration<double, std::micro>(Clock::now() - usage_start).count() / jobs;

  const std::optional<clockid_t> completer = testing::ThreadClock("cuda-completion");
  std::vector<double> latency_us(static_cast<size_t>(jobs));
  const double caller0 = testing::ClockSeconds(CLOCK_THREAD_CPUTIME_ID);
  const double process0 = testing::ClockSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const double completer0 = completer ? testing::ClockSeconds(*completer) : 0;
  const auto start = Clock::now();
  for (int i = 0; i < jobs; ++i) {
    const auto t = Clock::now();
    submit_and_wait();
    latency_us[static_cast<size_t>(i)] =
        std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double caller = testing::ClockSeconds(CLOCK_THREAD_CPUTIME_ID) - caller0;
  const double process = testing::ClockSeconds(CLOCK_PROCESS_CPUTIME_ID) - process0;
  const double completer_busy = completer ? testing::ClockSeconds(*completer) - completer0 : 0;

  if (single_launch_graphs) std::printf("single launches as CUDA graphs\n");
  std::printf("backend %s%s, %d jobs of an add of %lld f32, one at a time\n", backend.name().data(),
              backend.name() == "cuda" ? (" (completion " + completion + ")").c_str() : "", jobs,
              static_cast<long long>(elements));
  std::printf("  GetUsage                 %8.2f us/call (baseline)\n", usage_us);
  std::printf("  Submit and wait      p50 %8.2f us  p99 %8.2f us  mean %8.2f us (%.1fx GetUsage)\n",
              Percentile(latency_us, 0.5), Percentile(latency_us, 0.99), wall * 1e6 / jobs,
              Percentile(latency_us, 0.5) / usage_us);
  std::printf("  CPU per job: process %8.2f us", process * 1e6 / jobs);
  if (completer) {
    std::printf(", host %.2f us (submitting thread %.2f, completion thread %.2f)\n",
                (caller + completer_busy) * 1e6 / jobs, caller * 1e6 / jobs,
                completer_busy * 1e6 / jobs);
    std::this_thread::sleep_for(std::chrono::seconds(1));  // let it go idle
    const double idle0 = testing::ClockSeconds(*completer);
    const auto idle_start = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const double idle = testing::ClockSeconds(*completer) - idle0;
    const double idle_wall = std::chrono::duration<double>(Clock::now() - idle_start).count();
    std::printf("  completion thread CPU share: %.1f %% while jobs run, %.3f %% idle\n",
                100 * completer_busy / wall, 100 * idle / idle_wall);
  } else {
    std::printf("\n");
  }
  runtime->Close("done");
  return 0;
}
