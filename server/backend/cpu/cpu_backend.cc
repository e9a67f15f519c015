#include "server/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dtype.h"

namespace tessera {
namespace {

void* DataOf(const DeviceBuffer& buffer) { return static_cast<const HostBuffer&>(buffer).data(); }

// Runs one step; an output that is also an input is computed into a temporary first, so
// kernels never see overlapping buffers.
absl::Status RunStep(const Step& step, kernels::Parallel& parallel,
                     const std::shared_ptr<HostMappingCache>& cache) {
  std::vector<const void*> inputs;
  for (const auto& b : step.inputs) inputs.push_back(DataOf(*b));
  std::vector<void*> outputs;
  std::vector<std::pair<size_t, std::shared_ptr<HostBuffer>>> staged;
  for (size_t i = 0; i < step.outputs.size(); ++i) {
    void* out = DataOf(*step.outputs[i]);
    bool aliased = false;
    for (const void* in : inputs) aliased = aliased || in == out;
    if (aliased) {
      auto temp = HostBuffer::Create(step.outputs[i]->size(), HostFill::kCallerWritesAll, cache);
      if (!temp.ok()) return temp.status();
      std::memcpy((*temp)->data(), out, step.outputs[i]->size());  // matmul's beta reads it
      staged.emplace_back(i, *temp);
      out = (*temp)->data();
    }
    outputs.push_back(out);
  }
  absl::Status status = kernels::RunCpuKernel(step.plan, inputs, outputs, parallel);
  for (const auto& [i, temp] : staged) {
    std::memcpy(DataOf(*step.outputs[i]), temp->data(), step.outputs[i]->size());
  }
  return status;
}

class CpuContext final : public TenantContext {
 public:
  CpuContext(ContextInfo info, CpuScheduler::QueuePtr queue,
             std::shared_ptr<HostMappingCache> cache)
      : info_(std::move(info)), queue_(std::move(queue)), cache_(std::move(cache)) {}

  const ContextInfo& info() const override { return info_; }

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> Allocate(uint64_t bytes) override {
    auto buffer = HostBuffer::Create(bytes, HostFill::kZero, cache_);
    if (!buffer.ok()) return buffer.status();
    return std::shared_ptr<DeviceBuffer>(*std::move(buffer));
  }

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> AllocateForOverwrite(uint64_t bytes) override {
    auto buffer = HostBuffer::Create(bytes, HostFill::kCallerWritesAll, cache_);
    if (!buffer.ok()) return buffer.status();
    return std::shared_ptr<DeviceBuffer>(*std::move(buffer));
  }

  absl::Status CopyIn(DeviceBuffer& dst, uint64_t offset, const void* src,
                      uint64_t bytes) override {
    std::memcpy(static_cast<char*>(DataOf(dst)) + offset, src, bytes);
    return absl::OkStatus();
  }

  absl::Status CopyOut(const DeviceBuffer& src, uint64_t offset, void* dst,
                       uint64_t bytes) override {
    std::memcpy(dst, static_cast<const char*>(DataOf(src)) + offset, bytes);
    return absl::OkStatus();
  }

  // Steps run one after another and free their temporaries as they end: the largest step's
  // need is the job's. In-place outputs go through a temporary; f16/bf16 matmul widens its
  // operands and output to f32 (element-wise kernels widen bounded blocks on the stack).
  uint64_t ScratchBytes(const std::vector<Step>& steps) const override {
    uint64_t most = 0;
    for (const Step& step : steps) {
      uint64_t need = 0;
      for (const auto& out : step.outputs) {
        for (const auto& in : step.inputs) {
          if (in.get() == out.get()) {
            need += out->size();
            break;
          }
        }
      }
      if (step.plan.kernel->op == kernels::Op::kMatmul &&
          kernels::DTypeSize(step.plan.outputs[0].dtype) == 2) {
        for (const auto& in : step.inputs) need += 2 * in->size();
        for (const auto& out : step.outputs) need += 2 * out->size();
      }
      most = std::max(most, need);
    }
    return most;
  }

  void Enqueue(int stream, std::vector<Step> steps,
               absl::AnyInvocable<void(ExecResult) &&> done) override {
    const bool small = IsSmall(steps);
    queue_->Submit(
        stream,
        [steps = std::move(steps), done = std::move(done), cache = cache_](
            kernels::Parallel& parallel, bool cancelled) mutable {
          if (cancelled) {
            std::move(done)(
                ExecResult{absl::CancelledError("the tenant's context is closing"), -1});
            return;
          }
          const absl::Time start = absl::Now();
          for (size_t i = 0; i < steps.size(); ++i) {
            absl::Status status = RunStep(steps[i], parallel, cache);
            if (!status.ok()) {
              std::move(done)(ExecResult{status, static_cast<int>(i), absl::Now() - start});
              return;
            }
          }
          ExecResult result{absl::OkStatus(), -1, absl::Now() - start};
          steps.clear();  // buffers are released before the core hears of the completion
          std::move(done)(std::move(result));
        },
        small);
  }

  absl::Duration busy_time() const override { return queue_->busy_time(); }

 private:
  // Small enough to run on the thread that releases it (CpuTenantQueue::Submit): every
  // operand and result of every step together at most kInlineBytes, and no matmul (whose
  // work grows faster than its bytes). Such a job takes microseconds; the two thread
  // hand-offs it saves took tens.
  static constexpr uint64_t kInlineBytes = 64 << 10;
  static bool IsSmall(const std::vector<Step>& steps) {
    uint64_t bytes = 0;
    for (const Step& step : steps) {
      if (step.plan.kernel->op == kernels::Op::kMatmul) return false;
      for (const auto& in : step.inputs) bytes += in->size();
      for (const auto& out : step.outputs) bytes += out->size();
    }
    return bytes <= kInlineBytes;
  }

  const ContextInfo info_;
  CpuScheduler::QueuePtr queue_;
  const std::shared_ptr<HostMappingCache> cache_;
};

}  // namespace

CpuBackend::CpuBackend(Options options)
    : options_(std::move(options)),
      devices_{DeviceInfo{.index = 0,
                          .name = absl::StrCat("cpu (", options_.worker_threads, " threads)"),
                          .memory_bytes = options_.memory_bytes,
                          .context_limit = 0,
                          .compute_units = options_.worker_threads}},
      scheduler_(static_cast<int>(options_.worker_threads), options_.worker_nice),
      mappings_(std::make_shared<HostMappingCache>(
          std::min(kMaxKeptMappingBytes, options_.memory_bytes / 8))) {
  kernels::InitCpuKernels();
}

CpuBackend::~CpuBackend() { scheduler_.Stop(); }

MpsState CpuBackend::mps() const {
  return MpsState{MpsDecision::kNotApplicable, "MPS does not apply: the CPU backend is serving"};
}

absl::StatusOr<std::unique_ptr<TenantContext>> CpuBackend::CreateContext(
    const ContextRequest& request) {
  if (request.device_index != 0) {
    return absl::InvalidArgumentError(absl::StrCat("device_index is ", request.device_index,
                                                   "; the CPU backend has only device 0"));
  }
  return std::make_unique<CpuContext>(
      ContextInfo{.kind = ContextKind::kCpu,
                  .reason = absl::StrCat(
                      "CPU backend (", options_.reason,
                      "); compute share is the tenant's weight in the shared worker pool"),
                  .compute_share_enforced = true},
      scheduler_.AddTenant(request.quota.compute_share_percent,
                           static_cast<int>(request.quota.max_streams)),
      mappings_);
}

uint64_t PhysicalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

}  // namespace tessera
