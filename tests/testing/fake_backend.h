#ifndef TESSERA_TESTS_TESTING_FAKE_BACKEND_H_
#define TESSERA_TESTS_TESTING_FAKE_BACKEND_H_

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/status.h"

#include "server/backend/backend.h"

namespace tessera::testing {

/// A Backend with configurable devices standing in for the GPU backend this machine cannot
/// run: counts live contexts and can be told to fail context creation.
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
    return std::make_unique<Context>(&live_);
  }

  /// Every later CreateContext fails with `status` (OK to succeed again).
  void FailContexts(absl::Status status) { fail_with_ = std::move(status); }
  int live_contexts() const { return live_.load(); }
  const std::vector<ContextRequest>& created() const { return created_; }

 private:
  class Context final : public TenantContext {
   public:
    explicit Context(std::atomic<int>* live) : live_(live) { ++*live_; }
    ~Context() override { --*live_; }
    const ContextInfo& info() const override { return info_; }

   private:
    std::atomic<int>* live_;
    ContextInfo info_{ContextKind::kFallback, "fake context", false};
  };

  const std::vector<DeviceInfo> devices_;
  absl::Status fail_with_;
  std::vector<ContextRequest> created_;
  std::atomic<int> live_{0};
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_FAKE_BACKEND_H_
