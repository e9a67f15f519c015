#ifndef TESSERA_TESTS_TESTING_CONTEXT_RUNNER_H_
#define TESSERA_TESTS_TESTING_CONTEXT_RUNNER_H_

// Running plans on a backend's TenantContext directly (no server): the GPU tests and the
// fake-driver tests compare a CUDA context against a CPU one with these.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#include "kernels/registry.h"
#include "server/backend/backend.h"
#include "tests/testing/host_tensor.h"

namespace tessera::testing {

/// A 1 GiB tenant quota with `share`% of the compute and `streams` streams.
inline Quota TestQuota(uint32_t share = 50, uint32_t streams = 2) {
  return Quota{.device_memory_bytes = 1ull << 30,
               .compute_share_percent = share,
               .max_streams = streams,
               .max_queued_jobs = 64,
               .priority = Priority::kNormal};
}

/// Enqueues `steps` on `stream` and waits for the job's status (DEADLINE_EXCEEDED after
/// `timeout`).
inline absl::Status RunSteps(TenantContext& context, std::vector<Step> steps, int stream = 0,
                             absl::Duration timeout = absl::Seconds(60)) {
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<absl::Status>();
  context.Enqueue(stream, std::move(steps), [done, result](ExecResult r) {
    *result = std::move(r.status);
    done->Notify();
  });
  if (!done->WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError("the job did not finish in time");
  }
  return *result;
}

/// Allocates and uploads `inputs`, runs `plan` into fresh outputs and downloads them.
inline absl::StatusOr<std::vector<HostTensor>> RunPlan(TenantContext& context,
                                                       const kernels::Plan& plan,
                                                       const std::vector<HostTensor>& inputs,
                                                       int stream = 0) {
  Step step;
  step.plan = plan;
  for (const HostTensor& in : inputs) {
    auto b = context.Allocate(in.bytes.size());
    if (!b.ok()) return b.status();
    if (!in.bytes.empty()) {
      absl::Status s = context.CopyIn(**b, 0, in.data(), in.bytes.size());
      if (!s.ok()) return s;
    }
    step.inputs.push_back(*b);
  }
  std::vector<HostTensor> result;
  for (const TensorMeta& out : plan.outputs) {
    result.emplace_back(out.dtype, out.shape);
    auto b = context.Allocate(result.back().bytes.size());
    if (!b.ok()) return b.status();
    step.outputs.push_back(*b);
  }
  std::vector<std::shared_ptr<DeviceBuffer>> outputs = step.outputs;
  absl::Status status = RunSteps(context, {std::move(step)}, stream);
  if (!status.ok()) return status;
  for (size_t i = 0; i < outputs.size(); ++i) {
    absl::Status s = context.CopyOut(*outputs[i], 0, result[i].data(), result[i].bytes.size());
    if (!s.ok()) return s;
  }
  return result;
}

/// Random inputs for `plan`, in a range `kernel` is defined on (positive for log, sqrt,
/// rsqrt and pow).
inline std::vector<HostTensor> RandomInputs(const kernels::Plan& plan, const std::string& kernel,
                                            std::mt19937& rng) {
  const bool positive = kernel == "log" || kernel == "sqrt" || kernel == "rsqrt" || kernel == "pow";
  std::vector<HostTensor> inputs;
  for (const TensorMeta& m : plan.inputs) {
    inputs.emplace_back(m.dtype, m.shape);
    inputs.back().Randomize(rng, positive ? 0.1 : -2.0, positive ? 3.0 : 2.0);
  }
  return inputs;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_CONTEXT_RUNNER_H_
