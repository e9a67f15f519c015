// In-process cost of the launch path below gRPC: TenantRuntime::Submit of a 4 KiB add on the
// CPU backend, waiting for each job, compared with a bare GetUsage call on the same runtime.
// Usage: tessera_submit_bench [iterations]   (run under valgrind --tool=callgrind to profile)
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/notification.h"

#include "server/backend/cpu/cpu_backend.h"
#include "server/core/tenant_runtime.h"

int main(int argc, char** argv) {
  using namespace tessera;
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 20000;
  CpuBackend backend({.memory_bytes = uint64_t{1} << 30, .worker_threads = 2, .reason = "bench"});
  Quota quota{.device_memory_bytes = 64 << 20,
              .compute_share_percent = 100,
              .max_streams = 4,
              .max_queued_jobs = 1024,
              .priority = Priority::kNormal};
  auto runtime =
      std::make_shared<TenantRuntime>("bench", quota, *backend.CreateContext({"bench", quota, 0}));
  auto a = *runtime->CreateTensor({kernels::DType::kF32, {1024}}, "");
  auto c = *runtime->CreateTensor({kernels::DType::kF32, {1024}}, "");
  LaunchSpec add;
  add.kernel = "add";
  add.inputs = {Operand{a.handle}, Operand{a.handle}};
  add.outputs = {OutputSpec{OutputSpec::Kind::kHandle, c.handle, {}}};

  auto time = [&](auto fn) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) fn();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
               .count() /
           iterations;
  };
  double usage_us = time([&] { (void)runtime->Usage(); });
  double submit_us = time([&] {
    absl::Notification done;  // attached before enqueue, as the Compute service does
    (void)runtime->Submit(0, {add}, false, [&](const JobInfo&) { done.Notify(); });
    done.WaitForNotification();
  });
  std::printf("GetUsage %.2f us/call; Submit 4 KiB add and wait %.2f us/call (%d calls)\n",
              usage_us, submit_us, iterations);
  runtime->Close("done");
  return 0;
}
