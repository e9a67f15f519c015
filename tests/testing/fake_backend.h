#ifndef TESSERA_TESTS_TESTING_FAKE_BACKEND_H_
#define TESSERA_TESTS_TESTING_FAKE_BACKEND_H_

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"

#include "kernels/cpu/cpu_kernels.h"
#include "server/backend/backend.h"

namespace tessera::testing {

/// A Backend with configurable devices standing in for the GPU backend this machine cannot
/// run: buffers are host memory, programs run inline on the enqueuing thread with the CPU
/// kernels. Counts live contexts and can be told to fail context creation.
class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(std::vector<DeviceInfo> devices) : devices_(std::move(devices)) {}

  absl::string_view name() const override { return "fake"; }
  const std::vector<DeviceInfo>& devices() const override { return devices_; }
  MpsState mps() const override { return {MpsDecision::kFallback, "fake backend"}; }

  absl::StatusOr<std::unique_ptr<TenantContext>> CreateContext(
      const ContextRequest& request) override {
    if (!fail_with_.ok()) return fail_with_;
    created_.push_back(request);
    return std::make_unique<Context>(&live_, lost_);
  }

  /// Simulates a sticky fault in every context made so far: their buffers report lost().
  void LoseAllBuffers() { lost_->store(true); }

  /// Every later CreateContext fails with `status` (OK to succeed again).
  void FailContexts(absl::Status status) { fail_with_ = std::move(status); }
  int live_contexts() const { return live_.load(); }
  const std::vector<ContextRequest>& created() const { return created_; }

 private:
  class Buffer final : public DeviceBuffer {
   public:
    Buffer(uint64_t size, std::shared_ptr<std::atomic<bool>> lost)
        : data_(std::calloc(1, size + 1)), size_(size), lost_(std::move(lost)) {}
    ~Buffer() override { std::free(data_); }
    uint64_t size() const override { return size_; }
    bool lost() const override { return lost_->load(); }
    void* data() const { return data_; }

   private:
    void* data_;
    uint64_t size_;
    std::shared_ptr<std::atomic<bool>> lost_;
  };

  class Context final : public TenantContext {
   public:
    Context(std::atomic<int>* live, std::shared_ptr<std::atomic<bool>> lost)
        : live_(live), lost_(std::move(lost)) {
      ++*live_;
    }
    ~Context() override { --*live_; }
    const ContextInfo& info() const override { return info_; }
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> Allocate(uint64_t bytes) override {
      return std::make_shared<Buffer>(bytes, lost_);
    }
    absl::Status CopyIn(DeviceBuffer& dst, uint64_t offset, const void* src,
                        uint64_t bytes) override {
      std::memcpy(static_cast<char*>(static_cast<Buffer&>(dst).data()) + offset, src, bytes);
      return absl::OkStatus();
    }
    absl::Status CopyOut(const DeviceBuffer& src, uint64_t offset, void* dst,
                         uint64_t bytes) override {
      std::memcpy(dst, static_cast<const char*>(static_cast<const Buffer&>(src).data()) + offset,
                  bytes);
      return absl::OkStatus();
    }
    uint64_t ScratchBytes(const std::vector<Step>&) const override { return 0; }
    void Enqueue(int, std::vector<Step> steps,
                 absl::AnyInvocable<void(ExecResult) &&> done) override {
      kernels::SerialParallel serial;
      for (size_t i = 0; i < steps.size(); ++i) {
        std::vector<const void*> in;
        std::vector<void*> out;
        for (auto& b : steps[i].inputs) in.push_back(static_cast<Buffer&>(*b).data());
        for (auto& b : steps[i].outputs) out.push_back(static_cast<Buffer&>(*b).data());
        absl::Status s = kernels::RunCpuKernel(steps[i].plan, in, out, serial);
        if (!s.ok()) return std::move(done)(ExecResult{s, static_cast<int>(i)});
      }
      std::move(done)(ExecResult{absl::OkStatus(), -1});
    }
    absl::Duration busy_time() const override { return absl::ZeroDuration(); }

   private:
    std::atomic<int>* live_;
    std::shared_ptr<std::atomic<bool>> lost_;
    ContextInfo info_{ContextKind::kFallback, "fake context", false};
  };

  const std::vector<DeviceInfo> devices_;
  absl::Status fail_with_;
  std::vector<ContextRequest> created_;
  std::atomic<int> live_{0};
  std::shared_ptr<std::atomic<bool>> lost_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_FAKE_BACKEND_H_
