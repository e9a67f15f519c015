#include "server/core/tenant_runtime.h"

#include <cstring>
#include <memory>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/cpu/cpu_backend.h"
#include "tests/testing/fake_backend.h"

namespace tessera {
namespace {

using kernels::DType;
using kernels::TensorMeta;
using ::testing::HasSubstr;

class TenantRuntimeTest : public ::testing::Test {
 protected:
  std::shared_ptr<TenantRuntime> Runtime(uint64_t memory = 64 << 20, uint32_t streams = 2,
                                         uint32_t queued = 1024) {
    Quota quota{.device_memory_bytes = memory,
                .compute_share_percent = 100,
                .max_streams = streams,
                .max_queued_jobs = queued,
                .priority = Priority::kNormal};
    auto context = backend_.CreateContext({"t", quota, 0});
    EXPECT_TRUE(context.ok());
    return std::make_shared<TenantRuntime>("t", quota, *std::move(context));
  }

  static std::string Floats(std::vector<float> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }

  static std::vector<float> Read(TenantRuntime& rt, const std::string& handle) {
    auto reader = rt.BeginRead(handle);
    EXPECT_TRUE(reader.ok()) << reader.status();
    std::vector<float> v((*reader)->info().size_bytes / 4);
    EXPECT_TRUE((*reader)->Read(0, v.size() * 4, v.data()).ok());
    return v;
  }

  static LaunchSpec Step(std::string kernel, std::vector<std::string> inputs,
                         std::vector<std::string> outputs = {}) {
    LaunchSpec spec;
    spec.kernel = std::move(kernel);
    for (auto& h : inputs) spec.inputs.push_back(Operand{h});
    for (auto& h : outputs) {
      spec.outputs.push_back(OutputSpec{OutputSpec::Kind::kHandle, h, {}});
    }
    return spec;
  }

  static JobInfo Wait(TenantRuntime& rt, const std::string& id) {
    absl::Notification done;
    JobInfo info;
    EXPECT_TRUE(rt.WhenJobDone(id, [&](const JobInfo& j) {
                    info = j;
                    done.Notify();
                  }).ok());
    done.WaitForNotification();
    return info;
  }

  CpuBackend backend_{{.memory_bytes = uint64_t{1} << 30, .worker_threads = 2, .reason = "test"}};
};

TEST_F(TenantRuntimeTest, InPlaceLaunchesAreStagedThroughATemporary) {
  auto rt = Runtime();
  auto x = rt->CreateTensor({DType::kF32, {2, 2}}, Floats({1, 2, 3, 4}));
  ASSERT_TRUE(x.ok());
  // x = x @ x: the kernel must not read what it is overwriting.
  auto job = rt->Submit(0, {Step("matmul", {x->handle, x->handle}, {x->handle})}, false);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(Wait(*rt, job->id).state, JobState::kSucceeded);
  EXPECT_EQ(Read(*rt, x->handle), (std::vector<float>{7, 10, 15, 22}));
  // Element-wise in place too.
  auto scaled = rt->Submit(0, {Step("add", {x->handle, x->handle}, {x->handle})}, false);
  Wait(*rt, scaled->id);
  EXPECT_EQ(Read(*rt, x->handle), (std::vector<float>{14, 20, 30, 44}));
}

TEST_F(TenantRuntimeTest, ProgramOutputsCountAgainstTheQuotaBeforeAnythingRuns) {
  auto rt = Runtime(3 << 20);
  auto x = rt->CreateTensor({DType::kF32, {256, 1024}}, "");  // 1 MiB
  ASSERT_TRUE(x.ok());
  LaunchSpec copy1 = Step("copy", {x->handle});
  LaunchSpec copy2;
  copy2.kernel = "copy";
  copy2.inputs.push_back(Operand{"", 0, 0});
  LaunchSpec copy3 = copy2;
  copy3.inputs[0].step = 1;
  absl::Status s = rt->Submit(0, {copy1, copy2, copy3}, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("3145728 for new outputs"));
  EXPECT_EQ(rt->Usage().tensors, 1u);
  EXPECT_EQ(rt->Usage().memory_used_bytes, 1u << 20);
  auto ok = rt->Submit(0, {copy1, copy2}, true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(Wait(*rt, ok->id).state, JobState::kSucceeded);
  EXPECT_EQ(rt->Usage().memory_used_bytes, 3u << 20);
}

TEST_F(TenantRuntimeTest, TensorsInUseCannotBeDeletedOrOverwritten) {
  auto rt = Runtime(256 << 20, 1);
  auto big = rt->CreateTensor({DType::kF32, {600, 600}}, "");
  ASSERT_TRUE(big.ok());
  std::vector<LaunchSpec> slow;
  for (int i = 0; i < 30; ++i) slow.push_back(Step("matmul", {big->handle, big->handle}));
  auto running = rt->Submit(0, slow, true);
  ASSERT_TRUE(running.ok());
  auto queued = rt->Submit(0, {Step("neg", {big->handle})}, false);
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(rt->DeleteTensor(big->handle).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rt->BeginWrite(big->handle, std::nullopt).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The queued job's output is being written: it cannot be read yet.
  EXPECT_EQ(rt->BeginRead(queued->outputs[0].handle).status().code(),
            absl::StatusCode::kFailedPrecondition);
  Wait(*rt, queued->id);
  EXPECT_TRUE(rt->BeginRead(queued->outputs[0].handle).ok());
  EXPECT_TRUE(rt->DeleteTensor(big->handle).ok());
}

TEST_F(TenantRuntimeTest, WhenIdleCountsTheJobsItWaitedFor) {
  auto rt = Runtime();
  auto x = rt->CreateTensor({DType::kF32, {4}}, "");
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(rt->Submit(i % 2, {Step("neg", {x->handle})}, false).ok());
  absl::Notification done;
  uint64_t waited = 99;
  ASSERT_TRUE(rt->WhenIdle(std::nullopt, [&](uint64_t n) {
                  waited = n;
                  done.Notify();
                }).ok());
  done.WaitForNotification();
  EXPECT_LE(waited, 5u);
  EXPECT_EQ(rt->Usage().jobs_succeeded, 5u);
  EXPECT_EQ(rt->Usage().jobs_queued + rt->Usage().jobs_running, 0u);
  EXPECT_EQ(rt->WhenIdle(7, [](uint64_t) {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TenantRuntimeTest, CloseCancelsQueuedJobsAndRefusesNewCalls) {
  auto rt = Runtime(256 << 20, 1);
  auto big = rt->CreateTensor({DType::kF32, {600, 600}}, "");
  std::vector<LaunchSpec> slow;
  for (int i = 0; i < 20; ++i) slow.push_back(Step("matmul", {big->handle, big->handle}));
  auto running = rt->Submit(0, slow, true);
  auto queued = rt->Submit(0, {Step("neg", {big->handle})}, false);
  ASSERT_TRUE(running.ok() && queued.ok());
  absl::Notification cancelled;
  JobInfo seen;
  ASSERT_TRUE(rt->WhenJobDone(queued->id, [&](const JobInfo& j) {
                  seen = j;
                  cancelled.Notify();
                }).ok());
  rt->Close("is deregistered");
  ASSERT_TRUE(cancelled.HasBeenNotified());
  EXPECT_EQ(seen.state, JobState::kCancelled);
  absl::Status refused = rt->CreateTensor({DType::kF32, {1}}, "").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("is deregistered"));
  EXPECT_EQ(rt->Usage().memory_used_bytes, 0u);
}

TEST_F(TenantRuntimeTest, WritersCheckRangesAndAbortCleanly) {
  auto rt = Runtime();
  auto writer = rt->BeginWrite("", TensorMeta{DType::kU8, {10}});
  ASSERT_TRUE(writer.ok());
  EXPECT_TRUE((*writer)->Write(0, "abcde").ok());
  EXPECT_EQ((*writer)->Write(3, "xyz").code(), absl::StatusCode::kInvalidArgument);  // overlap
  EXPECT_EQ((*writer)->Write(8, "xyz").code(), absl::StatusCode::kInvalidArgument);  // past end
  EXPECT_EQ((*writer)->Finish().status().code(), absl::StatusCode::kInvalidArgument);
  // The new tensor exists only once the upload commits; its bytes are charged meanwhile.
  EXPECT_EQ(rt->Usage().tensors, 0u);
  EXPECT_EQ(rt->Usage().memory_used_bytes, 10u);
  writer->reset();  // aborted: nothing was created, nothing stays charged
  EXPECT_EQ(rt->Usage().tensors, 0u);
  EXPECT_EQ(rt->Usage().memory_used_bytes, 0u);
}

// A context fault (simulated by the fake GPU backend) loses the tenant's tensors: reading,
// writing and launching on them is DATA_LOSS naming the tensor; deleting them works and
// gives the memory back; new tensors work again.
TEST_F(TenantRuntimeTest, TensorsLostInAContextFaultAreDataLossUntilDeleted) {
  testing::FakeBackend gpu({DeviceInfo{.index = 0, .name = "fake gpu", .memory_bytes = 1 << 30}});
  Quota quota{.device_memory_bytes = 1 << 20,
              .compute_share_percent = 50,
              .max_streams = 1,
              .max_queued_jobs = 8,
              .priority = Priority::kNormal};
  auto context = gpu.CreateContext({"t", quota, 0});
  ASSERT_TRUE(context.ok());
  auto rt = std::make_shared<TenantRuntime>("t", quota, *std::move(context));
  auto x = rt->CreateTensor({DType::kF32, {2}}, Floats({1, 2}));
  ASSERT_TRUE(x.ok());
  gpu.LoseAllBuffers();

  auto read = rt->BeginRead(x->handle);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(x->handle));
  EXPECT_THAT(read.status().message(), HasSubstr("faulted"));
  EXPECT_EQ(rt->BeginWrite(x->handle, std::nullopt).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(rt->Submit(0, {Step("neg", {x->handle})}, false).status().code(),
            absl::StatusCode::kDataLoss);
  // Nothing was half-done: no job, the metadata is intact, deleting frees the quota.
  EXPECT_TRUE(rt->GetTensor(x->handle).ok());
  ASSERT_TRUE(rt->DeleteTensor(x->handle).ok());
  EXPECT_EQ(rt->Usage().memory_used_bytes, 0u);
}

}  // namespace
}  // namespace tessera
