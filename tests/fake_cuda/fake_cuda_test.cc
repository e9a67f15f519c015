// The CUDA backend module on the fake driver (tests/fake_cuda/driver), in CI: device
// discovery, the context kinds (MPS with its SM share, green, plain) as the driver grants
// them, the MPS client limit, MPS-wide faults and recovery, the launcher's geometry against
// the CPU backend (the fake runs our kernels compiled for the host), and a real server process
// serving on the fake GPU. ctest puts the fake first on LD_LIBRARY_PATH; each test runs in its own
// process, so the environment each one sets is read by that process's cuInit only. Every test ends
// with no driver misuse and nothing left on the device: no object the backend did not give
// back (fake_cuda.h), checked after the backend is gone, and for the server at its exit.
#include "tests/fake_cuda/driver/fake_cuda.h"

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <cuda.h>
#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "kernels/registry.h"
#include "server/backend/cpu/cpu_backend.h"
#include "server/backend/cuda_module.h"
#include "server/backend/select.h"
#include "tessera/client.h"
#include "tests/testing/context_runner.h"
#include "tests/testing/fake_mps.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/thread_clock.h"

namespace tessera {
namespace {

using kernels::DType;
using kernels::TensorMeta;
using testing::FakeCudaKind;
using ::testing::HasSubstr;
using ::testing::Not;

absl::Status RunJob(TenantContext& context, std::vector<Step> steps) {
  return testing::RunSteps(context, std::move(steps), 0, absl::Seconds(30));
}

class FakeCudaTest : public ::testing::Test {
 protected:
  // No MPS unless a test starts the fake daemon: a host's real /tmp/nvidia-mps stays out.
  void SetUp() override { setenv("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/tessera-no-mps", 1); }

  // After the backend (and every context, destroyed by the test body): no misuse, no leak.
  void TearDown() override {
    backend_.reset();
    if (!fake_) return;
    EXPECT_EQ(fake_->misuses(), 0) << "driver API misuse (see stderr)";
    std::string report;
    EXPECT_EQ(fake_->Leaks(&report), 0) << "driver objects the backend did not give back:\n"
                                        << report;
  }

  /// The CUDA backend on the fake driver, with `env` set for its cuInit. Jobs' completion is
  /// seen by the spinning thread unless `completion` says otherwise (the server on this
  /// 2-CPU machine picks host functions, so the integration suite covers those).
  /// `single_launch_graphs`: --cuda_single_launch_graphs.
  Backend& Cuda(const std::string& mps = "auto",
                const std::vector<std::pair<std::string, std::string>>& env = {},
                const std::string& completion = "spin", bool single_launch_graphs = false) {
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    // Counting starts before the backend loads its kernel libraries (the fake may still be
    // loaded from an earlier test when the whole binary runs in one process).
    if (auto loaded = testing::FakeCudaDriver::Loaded()) loaded->Reset();
    absl::StatusOr<BackendChoice> choice =
        SelectBackend({.backend = "cuda",
                       .mps = mps,
                       .cuda_completion = completion,
                       .cuda_single_launch_graphs = single_launch_graphs});
    EXPECT_TRUE(choice.ok()) << choice.status();
    if (!choice.ok()) std::abort();  // every test here needs it
    backend_ = std::move(choice->backend);
    fake_ = testing::FakeCudaDriver::Loaded();
    EXPECT_TRUE(fake_.has_value()) << "libcuda.so.1 is not the fake driver";
    return *backend_;
  }

  std::unique_ptr<TenantContext> Context(const std::string& id, uint32_t share,
                                         uint32_t streams = 2) {
    auto context = backend_->CreateContext({id, testing::TestQuota(share, streams), 0});
    EXPECT_TRUE(context.ok()) << context.status();
    return context.ok() ? *std::move(context) : nullptr;
  }

  std::unique_ptr<Backend> backend_;
  std::optional<testing::FakeCudaDriver> fake_;
};

TEST_F(FakeCudaTest, TheModuleLoadsTheDriverAndListsItsDevices) {
  Backend& cuda =
      Cuda("auto", {{"TESSERA_FAKE_CUDA_DEVICES", "2"}, {"TESSERA_FAKE_CUDA_SMS", "100"}});
  EXPECT_EQ(cuda.name(), "cuda");
  ASSERT_EQ(cuda.devices().size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const DeviceInfo& d = cuda.devices()[i];
    EXPECT_EQ(d.index, i);
    EXPECT_EQ(d.name, absl::StrCat("Tessera fake GPU ", i));
    EXPECT_EQ(d.compute_units, 100u);
    EXPECT_EQ(d.memory_bytes, 4096ull << 20);
    EXPECT_EQ(d.context_limit, 0u);  // no MPS, no client limit
  }
  EXPECT_EQ(cuda.mps().decision, MpsDecision::kFallback) << cuda.mps().reason;
  auto second = cuda.CreateContext({"on-gpu-1", testing::TestQuota(50), 1});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(cuda.CreateContext({"nowhere", testing::TestQuota(50), 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(FakeCudaTest, GreenContextsGetTheirShareOnDisjointSmsWhileTheDeviceHasRoom) {
  Cuda();
  // 25% of 132 SMs is 33, rounded up to the alignment of 8: 40, five of the 16 groups.
  auto quarter = Context("quarter", 25);
  ASSERT_NE(quarter, nullptr);
  EXPECT_EQ(quarter->info().kind, ContextKind::kGreen) << quarter->info().reason;
  EXPECT_TRUE(quarter->info().compute_share_enforced);
  EXPECT_THAT(quarter->info().reason,
              HasSubstr("the driver granted 40 SMs: SM groups 0-4 of 16 (8 SMs each)"));
  // 1% is 2 SMs, raised to the minimum partition (8): the next free group.
  auto tiny = Context("tiny", 1);
  ASSERT_NE(tiny, nullptr);
  EXPECT_THAT(tiny->info().reason, HasSubstr("the driver granted 8 SMs: SM groups 5 of 16"));
  auto half = Context("half", 50);  // 66 -> 72 SMs: nine groups, only ten are free
  ASSERT_NE(half, nullptr);
  EXPECT_THAT(half->info().reason, HasSubstr("SM groups 6-14 of 16 (8 SMs each)"));
  // Overcommitted: the last free group and the least used after it, said so.
  auto more = Context("more", 25);
  ASSERT_NE(more, nullptr);
  EXPECT_THAT(more->info().reason,
              HasSubstr("SM groups 0-3, 15 of 16 (8 SMs each), 4 of them shared with other"));
  // Groups return when a context goes: the freed group 4 first, then the least used.
  quarter.reset();
  auto again = Context("again", 25);
  ASSERT_NE(again, nullptr);
  EXPECT_THAT(again->info().reason, HasSubstr("SM groups 0-4 of 16 (8 SMs each), 4 of them"));
  // The whole device needs no partition.
  auto whole = Context("whole", 100);
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(whole->info().kind, ContextKind::kFallback) << whole->info().reason;
}

TEST_F(FakeCudaTest, WithoutGreenEntryPointsTheShareIsAdvisoryAndSaysWhy) {
  Cuda("auto", {{"TESSERA_FAKE_CUDA_GREEN", "0"}});
  auto context = Context("plain", 25);
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->info().kind, ContextKind::kFallback);
  EXPECT_FALSE(context->info().compute_share_enforced);
  EXPECT_THAT(context->info().reason, HasSubstr("lacks the green-context entry points"));
}

TEST_F(FakeCudaTest, AGreenContextTheDriverRefusesFallsBackToAPlainOneAndSaysWhy) {
  Cuda("auto", {{"TESSERA_FAKE_CUDA_GREEN", "fail"}});
  auto context = Context("refused", 25);
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->info().kind, ContextKind::kFallback);
  EXPECT_FALSE(context->info().compute_share_enforced);
  EXPECT_THAT(context->info().reason, HasSubstr("CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"));
  // It works like any other context.
  auto buffer = context->Allocate(64);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
}

TEST_F(FakeCudaTest, UnderMpsEachTenantGetsAClientContextWithItsSmShare) {
  testing::FakeMps mps;
  mps.Start();
  Backend& cuda = Cuda("auto", {{"CUDA_MPS_PIPE_DIRECTORY", mps.dir()}});
  ASSERT_EQ(cuda.mps().decision, MpsDecision::kMps) << cuda.mps().reason;
  EXPECT_EQ(cuda.devices()[0].context_limit, 48u);
  // 25% of 132 is 33 SMs; the driver rounds execution affinity up to an even count.
  auto context = Context("mps-tenant", 25);
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->info().kind, ContextKind::kMps) << context->info().reason;
  EXPECT_TRUE(context->info().compute_share_enforced);
  EXPECT_THAT(context->info().reason, HasSubstr("the driver granted 34 SMs"));
}

TEST_F(FakeCudaTest, MpsOffKeepsTheDriverAwayFromARunningDaemon) {
  testing::FakeMps mps;
  mps.Start();
  // Were the driver to join the daemon anyway, the green context request would be refused
  // and execution affinity demanded; the backend points it at an empty pipe directory.
  Backend& cuda = Cuda("off", {{"CUDA_MPS_PIPE_DIRECTORY", mps.dir()}});
  EXPECT_EQ(cuda.mps().decision, MpsDecision::kFallback) << cuda.mps().reason;
  EXPECT_EQ(cuda.devices()[0].context_limit, 0u);
  auto context = Context("no-mps", 25);
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->info().kind, ContextKind::kGreen) << context->info().reason;
}

TEST_F(FakeCudaTest, TheDriversMpsClientLimitIsResourceExhausted) {
  testing::FakeMps mps;
  mps.Start();
  Backend& cuda = Cuda("auto", {{"CUDA_MPS_PIPE_DIRECTORY", mps.dir()}});
  ASSERT_EQ(cuda.mps().decision, MpsDecision::kMps) << cuda.mps().reason;
  std::vector<std::unique_ptr<TenantContext>> contexts;
  for (int i = 0; i < 48; ++i) {
    auto c = cuda.CreateContext({absl::StrCat("t", i), testing::TestQuota(10, 1), 0});
    ASSERT_TRUE(c.ok()) << i << ": " << c.status();
    contexts.push_back(*std::move(c));
  }
  auto refused = cuda.CreateContext({"one-too-many", testing::TestQuota(10, 1), 0});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"));
  contexts.pop_back();  // a client leaves: there is room again
  EXPECT_TRUE(cuda.CreateContext({"next", testing::TestQuota(10, 1), 0}).ok());
}

TEST_F(FakeCudaTest, AnMpsFaultReachesEveryTenantAndStopsTheBackendForARestart) {
  testing::FakeMps mps;
  mps.Start();
  Backend& cuda = Cuda("auto", {{"CUDA_MPS_PIPE_DIRECTORY", mps.dir()}});
  ASSERT_EQ(cuda.mps().decision, MpsDecision::kMps) << cuda.mps().reason;
  absl::Notification stopped;
  absl::Status why;
  int calls = 0;
  cuda.SetFatalHandler([&](const absl::Status& status) {
    why = status;
    ++calls;
    stopped.Notify();
  });
  void* module = dlopen(TESSERA_CUDA_MODULE_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(module, nullptr);
  auto inject = reinterpret_cast<CudaInjectFault>(dlsym(module, kCudaModuleInjectFault));
  ASSERT_NE(inject, nullptr);
  auto faulty = Context("faulty", 50, 1);
  auto bystander = Context("bystander", 50, 1);
  ASSERT_TRUE(faulty != nullptr && bystander != nullptr);
  auto a = *faulty->Allocate(4096);
  auto b = *bystander->Allocate(4096);
  auto fill = *kernels::Registry::Global().Prepare(
      "fill", {}, {{"value", 2.0}, {"shape", std::vector<int64_t>{1024}}});

  ASSERT_TRUE(inject(*faulty, 0).ok());
  absl::Status failed = RunJob(*faulty, {Step{fill, {}, {a}}});
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("the server restarts"));
  EXPECT_TRUE(a->lost());
  // An illegal address is fatal to the process (and MPS reports it to every client on the
  // GPU): the backend faults the bystander's context too without waiting for it to notice,
  // re-probes the MPS daemon, and tells its owner once that it can run nothing more.
  ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(why.message(), HasSubstr("fatal fault on GPU 0 (CUDA_ERROR_ILLEGAL_ADDRESS)"));
  EXPECT_TRUE(b->lost());
  EXPECT_THAT(cuda.mps().reason, HasSubstr("MPS server fault on GPU 0"));
  absl::Status other = RunJob(*bystander, {Step{fill, {}, {b}}});
  EXPECT_THAT(other.code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDataLoss))
      << other;
  dlclose(module);

  // Nothing is rebuilt in this process: each tenant is told why, and so is a new one.
  for (TenantContext* c : {faulty.get(), bystander.get()}) {
    auto fresh = c->Allocate(4096);
    EXPECT_EQ(fresh.status().code(), absl::StatusCode::kUnavailable) << fresh.status();
    EXPECT_THAT(fresh.status().message(), HasSubstr("relaunched"));
  }
  auto refused = cuda.CreateContext({"newcomer", testing::TestQuota(50, 1), 0});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_EQ(calls, 1);
}

// A fatal fault whose context is destroyed before the completion thread sees it (the tenant
// deregistered while its job ran) still stops the backend: the error reaches the backend
// from wherever the driver returned it.
TEST_F(FakeCudaTest, AFatalFaultInAContextThatIsGoneStillStopsTheBackend) {
  Backend& cuda = Cuda("auto", {{"TESSERA_FAKE_CUDA_FAULT_KERNEL", "tessera_fill"}});
  unsetenv("TESSERA_FAKE_CUDA_FAULT_KERNEL");  // read by cuInit, above; not by later tests
  absl::Notification stopped;
  cuda.SetFatalHandler([&](const absl::Status&) { stopped.Notify(); });
  auto doomed = Context("doomed", 100, 1);
  ASSERT_NE(doomed, nullptr);
  auto buffer = *doomed->Allocate(4096);
  auto fill = *kernels::Registry::Global().Prepare(
      "fill", {}, {{"value", 1.0}, {"shape", std::vector<int64_t>{1024}}});
  absl::Notification done;
  doomed->Enqueue(0, {Step{fill, {}, {buffer}}}, [&](ExecResult) { done.Notify(); });
  buffer.reset();
  doomed.reset();  // at once: the context finds the fault itself as it goes
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(10)));
  auto refused = cuda.CreateContext({"newcomer", testing::TestQuota(50, 1), 0});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
}

// ---- nothing left behind -----------------------------------------------------------------

// A tenant whose context goes gives back everything it held on the device while the backend
// runs on: its context, streams, the events of its jobs and of its copies, pinned staging,
// device memory and in-place temporaries. Each context kind destroys its own way.
class FakeCudaTenantChurnTest : public FakeCudaTest,
                                public ::testing::WithParamInterface<ContextKind> {};

TEST_P(FakeCudaTenantChurnTest, ATenantThatGoesLeavesNothingOnTheDevice) {
  testing::FakeMps mps;
  switch (GetParam()) {
    case ContextKind::kMps:
      mps.Start();
      Cuda("auto", {{"CUDA_MPS_PIPE_DIRECTORY", mps.dir()}});
      break;
    case ContextKind::kFallback:
      Cuda("auto", {{"TESSERA_FAKE_CUDA_GREEN", "0"}});
      break;
    default:
      Cuda();
  }
  const int64_t n = 1100;  // 4.6 MiB: one chunk of pinned staging
  auto transpose = *kernels::Registry::Global().Prepare("transpose", {{DType::kF32, {n, n}}}, {});
  std::vector<float> x(n * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 1000);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("tenant ", round));
    auto context = Context(absl::StrCat("churn-", round), 25);
    ASSERT_NE(context, nullptr);
    ASSERT_EQ(context->info().kind, GetParam()) << context->info().reason;
    auto buffer = context->Allocate(x.size() * 4);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_TRUE(context->CopyIn(**buffer, 0, x.data(), x.size() * 4).ok());
    // In place: staged through a temporary.
    ASSERT_TRUE(RunJob(*context, {Step{transpose, {*buffer}, {*buffer}}}).ok());
    float corner = 0;
    ASSERT_TRUE(context->CopyOut(**buffer, (n - 1) * 4, &corner, 4).ok());
    EXPECT_EQ(corner, x[(n - 1) * n]);
  }
  // Everything but the backend's own kernel libraries. A job's buffers (an in-place temporary
  // holds the context) go on the completion thread just after its `done`: allow it a moment.
  auto alive = [&] {
    long count = 0;
    for (int k = 0; k < testing::kFakeCudaKinds; ++k) {
      if (k != static_cast<int>(FakeCudaKind::kLibrary)) {
        count += fake_->tally(static_cast<FakeCudaKind>(k)).live;
      }
    }
    return count;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (alive() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  std::string report;
  EXPECT_EQ(fake_->OutlivedContexts(&report), 0) << report;
  for (int k = 0; k < testing::kFakeCudaKinds; ++k) {
    const auto kind = static_cast<FakeCudaKind>(k);
    if (kind == FakeCudaKind::kLibrary) continue;
    EXPECT_EQ(fake_->tally(kind).live, 0) << testing::FakeCudaKindName(kind) << "s still alive";
  }
}

INSTANTIATE_TEST_SUITE_P(EveryContextKind, FakeCudaTenantChurnTest,
                         ::testing::Values(ContextKind::kGreen, ContextKind::kFallback,
                                           ContextKind::kMps),
                         [](const ::testing::TestParamInfo<ContextKind>& param) {
                           return std::string(ContextKindName(param.param));
                         });

// A job whose submission fails part-way (the driver out of memory for its second event, for
// the records of its start or end, for its completion callback) gives back what it had made.
TEST_F(FakeCudaTest, AJobWhoseSubmissionFailsGivesBackItsEvents) {
  auto fill = *kernels::Registry::Global().Prepare(
      "fill", {}, {{"value", 1.0}, {"shape", std::vector<int64_t>{1024}}});
  for (const char* completion : {"spin", "host_function"}) {
    SCOPED_TRACE(completion);
    Cuda("auto", {}, completion);
    auto context = Context("refused-jobs", 25);
    ASSERT_NE(context, nullptr);
    auto buffer = *context->Allocate(4096);
    std::vector<std::pair<const char*, int>> failures = {
        {"cuEventCreate", 1}, {"cuEventRecord", 0}, {"cuEventRecord", 1}};
    if (completion == std::string("host_function")) failures.push_back({"cuLaunchHostFunc", 0});
    for (const auto& [call, after] : failures) {
      SCOPED_TRACE(absl::StrCat(call, " after ", after, " more"));
      fake_->Fail(call, after, CUDA_ERROR_OUT_OF_MEMORY);
      EXPECT_EQ(RunJob(*context, {Step{fill, {}, {buffer}}}).code(),
                absl::StatusCode::kResourceExhausted);
      EXPECT_TRUE(RunJob(*context, {Step{fill, {}, {buffer}}}).ok());  // not a fault
    }
    buffer.reset();
    context.reset();
    std::string report;
    EXPECT_EQ(fake_->OutlivedContexts(&report), 0) << report;
    backend_.reset();
  }
}

// A context whose creation fails part-way (the driver out of memory for its last stream)
// gives back what it had made, and so does the backend's next try.
TEST_F(FakeCudaTest, AContextThatCannotBeCreatedGivesBackWhatItHadMade) {
  Backend& cuda = Cuda();
  fake_->Fail("cuGreenCtxStreamCreate", 2, CUDA_ERROR_OUT_OF_MEMORY);
  auto refused = cuda.CreateContext({"refused", testing::TestQuota(25, 2), 0});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  std::string report;
  EXPECT_EQ(fake_->OutlivedContexts(&report), 0) << report;
  EXPECT_EQ(fake_->tally(FakeCudaKind::kGreenContext).live, 0);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kStream).live, 0);
  auto context = Context("accepted", 25);  // its SM groups were given back too
  ASSERT_NE(context, nullptr);
  EXPECT_THAT(context->info().reason, HasSubstr("SM groups 0-4 of 16"));
}

// A sticky error that stays with its context (an uncorrectable ECC error here; NVIDIA does not
// document it as fatal to the process) faults only that tenant, whose context is rebuilt.
TEST_F(FakeCudaTest, AGreenContextRebuiltAfterAFaultLeavesNothingOfTheOldOneBehind) {
  Cuda();
  auto context = Context("rebuilt", 25, 2);
  auto bystander = Context("bystander", 25, 1);
  ASSERT_TRUE(context != nullptr && bystander != nullptr);
  ASSERT_EQ(context->info().kind, ContextKind::kGreen) << context->info().reason;
  auto fill = *kernels::Registry::Global().Prepare(
      "fill", {}, {{"value", 5.0}, {"shape", std::vector<int64_t>{1024}}});
  auto lost = *context->Allocate(4096);
  auto kept = *bystander->Allocate(4096);
  float value = 0;
  ASSERT_TRUE(context->CopyOut(*lost, 0, &value, 4).ok());        // pinned staging and its events
  fake_->Fail("cuEventRecord", 1, CUDA_ERROR_ECC_UNCORRECTABLE);  // the job's end
  absl::Status failed = RunJob(*context, {Step{fill, {}, {lost}}});
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("the context is being rebuilt"));
  ASSERT_TRUE(lost->lost());
  lost.reset();
  // The next use rebuilds the context; the faulted one is gone, and with it everything it held
  // that cuGreenCtxDestroy does not free (its streams first of all).
  auto fresh = context->Allocate(4096);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_TRUE(RunJob(*context, {Step{fill, {}, {*fresh}}}).ok());
  ASSERT_TRUE(context->CopyOut(**fresh, 4092, &value, 4).ok());
  EXPECT_EQ(value, 5.0f);
  // The other tenant never noticed.
  EXPECT_FALSE(kept->lost());
  EXPECT_TRUE(RunJob(*bystander, {Step{fill, {}, {kept}}}).ok());
  std::string report;
  EXPECT_EQ(fake_->OutlivedContexts(&report), 0) << report;
  EXPECT_EQ(fake_->tally(FakeCudaKind::kGreenContext).live, 2);
}

// ---- the launcher's geometry: broadcasting, axes, permutations, in-place staging ---------

struct GeometryCase {
  std::string kernel;
  std::vector<TensorMeta> inputs;
  kernels::Attrs attrs;
};

std::vector<GeometryCase> F32Cases() {
  const DType f = DType::kF32;
  std::vector<GeometryCase> cases;
  for (const char* k :
       {"neg", "abs", "relu", "exp", "log", "sqrt", "rsqrt", "gelu", "sigmoid", "tanh"}) {
    cases.push_back({k, {{f, {4099}}}, {}});
  }
  cases.push_back({"scale", {{f, {3, 5}}}, {{"alpha", 1.5}, {"beta", -0.25}}});
  for (const char* k : {"add", "sub", "mul", "div", "maximum", "minimum", "pow"}) {
    cases.push_back({k, {{f, {4099}}, {f, {4099}}}, {}});
    cases.push_back({k, {{f, {4, 1, 33}}, {f, {5, 33}}}, {}});
    cases.push_back({k, {{f, {7, 9}}, {f, {}}}, {}});
    cases.push_back({k, {{f, {2, 1, 3, 1}}, {f, {1, 4, 1, 5}}}, {}});
  }
  for (const char* k : {"sum", "mean", "max", "min"}) {
    cases.push_back({k, {{f, {6, 7, 130}}}, {{"axes", std::vector<int64_t>{2}}}});
    cases.push_back(
        {k, {{f, {6, 7, 130}}}, {{"axes", std::vector<int64_t>{0, 2}}, {"keepdims", true}}});
    cases.push_back({k, {{f, {6, 7, 130}}}, {{"axes", std::vector<int64_t>{1}}}});
    cases.push_back({k, {{f, {6, 7, 130}}}, {}});
  }
  cases.push_back({"transpose", {{f, {3, 40, 5}}}, {{"perm", std::vector<int64_t>{2, 0, 1}}}});
  cases.push_back({"transpose", {{f, {33, 65}}}, {}});
  cases.push_back(
      {"fill", {}, {{"value", 1.75}, {"dtype", "f32"}, {"shape", std::vector<int64_t>{3, 1000}}}});
  cases.push_back({"copy", {{f, {1000}}}, {}});
  return cases;
}

void ExpectSame(const testing::HostTensor& want, const testing::HostTensor& got) {
  ASSERT_EQ(want.size(), got.size());
  int mismatches = 0;
  for (int64_t i = 0; i < want.size() && mismatches < 5; ++i) {
    const double w = want.Get(i), g = got.Get(i);
    if ((std::isnan(w) && std::isnan(g)) || std::abs(w - g) <= 2e-5 * std::max(1.0, std::abs(w))) {
      continue;
    }
    ++mismatches;
    ADD_FAILURE() << "element " << i << ": cpu " << w << ", cuda " << g;
  }
}

TEST_F(FakeCudaTest, LaunchGeometryMatchesTheCpuBackend) {
  Cuda();
  auto gpu = Context("geometry", 50);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu_backend(CpuBackend::Options{.memory_bytes = 1ull << 30, .reason = "test"});
  auto cpu = *cpu_backend.CreateContext({"cpu", testing::TestQuota(50), 0});
  std::mt19937 rng(11);
  for (const GeometryCase& c : F32Cases()) {
    auto plan = kernels::Registry::Global().Prepare(c.kernel, c.inputs, c.attrs);
    ASSERT_TRUE(plan.ok()) << c.kernel << ": " << plan.status();
    SCOPED_TRACE(absl::StrCat(c.kernel, " -> ", plan->outputs[0].shape.size(), "-d output"));
    std::vector<testing::HostTensor> inputs = testing::RandomInputs(*plan, c.kernel, rng);
    auto want = testing::RunPlan(*cpu, *plan, inputs);
    auto got = testing::RunPlan(*gpu, *plan, inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(want->size(), got->size());
    for (size_t o = 0; o < want->size(); ++o) ExpectSame((*want)[o], (*got)[o]);
  }
}

// The element-wise kernels load several 16-byte packs per thread before computing any
// (kUnroll in kernels/cuda/elementwise.cu); on a one-SM device the grid is small enough that
// every thread runs those rounds, then the single-pack rounds and the scalar tail, so each
// path is checked against the CPU backend, for every lane width (f64 2, f32 4, f16 8, u8 16).
TEST_F(FakeCudaTest, ElementWiseKernelsOnAOneSmDeviceMatchTheCpuBackend) {
  Cuda("auto", {{"TESSERA_FAKE_CUDA_SMS", "1"}});
  auto gpu = Context("one-sm", 100);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu_backend(CpuBackend::Options{.memory_bytes = 1ull << 30, .reason = "test"});
  auto cpu = *cpu_backend.CreateContext({"cpu", testing::TestQuota(100), 0});
  std::mt19937 rng(31);
  // 16 blocks of 256 threads: 4096 threads; 5 unrolled rounds of 4 packs, then 3 single
  // packs, then a tail shorter than a pack.
  for (const DType dtype : {DType::kF64, DType::kF32, DType::kF16, DType::kU8}) {
    const int64_t lanes = 16 / static_cast<int64_t>(kernels::DTypeSize(dtype));
    const int64_t n = (4096 * 4 * 5 + 4096 * 3 + 5) * lanes + lanes - 1;
    std::vector<GeometryCase> cases = {{"add", {{dtype, {n}}, {dtype, {n}}}, {}}};
    if (dtype != DType::kU8) {  // u8 has no unary arithmetic
      cases.push_back({"neg", {{dtype, {n}}}, {}});
      cases.push_back({"scale", {{dtype, {n}}}, {{"alpha", 2.0}, {"beta", 1.0}}});
    }
    for (const GeometryCase& c : cases) {
      auto plan = kernels::Registry::Global().Prepare(c.kernel, c.inputs, c.attrs);
      ASSERT_TRUE(plan.ok()) << c.kernel << ": " << plan.status();
      SCOPED_TRACE(absl::StrCat(c.kernel, " ", kernels::DTypeName(dtype)));
      std::vector<testing::HostTensor> inputs = testing::RandomInputs(*plan, c.kernel, rng);
      auto want = testing::RunPlan(*cpu, *plan, inputs);
      auto got = testing::RunPlan(*gpu, *plan, inputs);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSame((*want)[0], (*got)[0]);
    }
  }
}

TEST_F(FakeCudaTest, AnInPlaceLaunchThatCannotAliasIsStagedThroughATemporary) {
  Cuda();
  auto gpu = Context("in-place", 50);
  ASSERT_NE(gpu, nullptr);
  // A square transpose written over its own input: element (i, j) must read the original.
  const int64_t n = 37;
  auto plan = *kernels::Registry::Global().Prepare("transpose", {{DType::kF32, {n, n}}}, {});
  std::vector<float> x(n * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  auto buffer = *gpu->Allocate(x.size() * 4);
  ASSERT_TRUE(gpu->CopyIn(*buffer, 0, x.data(), x.size() * 4).ok());
  ASSERT_TRUE(RunJob(*gpu, {Step{plan, {buffer}, {buffer}}}).ok());
  std::vector<float> y(x.size());
  ASSERT_TRUE(gpu->CopyOut(*buffer, 0, y.data(), y.size() * 4).ok());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(y[i * n + j], x[j * n + i]) << i << "," << j;
  }
}

// The host's work per job, counted in driver calls (each one the real driver's host path too):
// a single launch and a 10-step program. The budgets are today's counts; a change that adds
// calls to the job path fails here and has to say why (docs/benchmarks.md, "Host work per
// job"). Counted over 20 jobs after a warm-up one, so one-time work (loading, the first
// cuBLAS call) stays out. The completion thread's polls (a context push, an event query and
// a pop each) depend on timing, so they are reported beside the budget, not in it.
TEST_F(FakeCudaTest, AJobsDriverCallsStayWithinTheirBudget) {
  const int64_t n = 1024;
  auto add =
      *kernels::Registry::Global().Prepare("add", {{DType::kF32, {n}}, {DType::kF32, {n}}}, {});
  constexpr int kJobs = 20;
  // Calls per entry point ("name count" lines) into a map.
  auto by_entry = [&] {
    std::string text;
    fake_->Calls(&text);
    std::map<std::string, long> calls;
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      std::pair<std::string, std::string> parts = absl::StrSplit(line, ' ');
      calls[parts.first] = std::stol(parts.second);
    }
    return calls;
  };
  struct PerJob {
    double budgeted = 0, polling = 0;
    std::string detail;
  };
  auto per_job = [&](TenantContext& context, const std::vector<Step>& steps) {
    // Warm-up: the first run loads, the second captures a program as a CUDA graph.
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(RunJob(context, steps).ok());
    const std::map<std::string, long> before = by_entry();
    for (int i = 0; i < kJobs; ++i) EXPECT_TRUE(RunJob(context, steps).ok());
    PerJob result;
    for (const auto& [name, after] : by_entry()) {
      auto it = before.find(name);
      const double calls = static_cast<double>(after - (it == before.end() ? 0 : it->second));
      if (calls == 0) continue;
      const bool polling =
          name == "cuEventQuery" || name == "cuCtxPushCurrent" || name == "cuCtxPopCurrent";
      (polling ? result.polling : result.budgeted) += calls / kJobs;
      absl::StrAppend(&result.detail, name, " ", calls / kJobs, polling ? " (polling)" : "", "\n");
    }
    return result;
  };
  // Measured 2026-11-28: a launch 9 (two events created, recorded and destroyed, their
  // elapsed time, a host function, the kernel) + 8 polling, a 10-step program 18 + 8; with
  // the events reused (Incarnation::spare_events) 5 + 7-8 and 14 + 8. 2026-11-29: without
  // the host function (--cuda_completion=spin) 4 and 13; the spinning thread's polls grow
  // with the job's length instead (reported, not budgeted). With the program replayed as a
  // CUDA graph (its launch in place of ten), 4 and 4: record, graph launch, record, elapsed.
  // A single launch as a graph (--cuda_single_launch_graphs) stays at 4.
  struct Mode {
    const char* completion;
    bool single_launch_graphs;
    double launch_budget, program_budget;
  };
  for (const Mode& mode :
       {Mode{"spin", false, 4, 4}, Mode{"host_function", false, 5, 5}, Mode{"spin", true, 4, 4}}) {
    SCOPED_TRACE(absl::StrCat(mode.completion, mode.single_launch_graphs ? ", single" : ""));
    Cuda("auto", {}, mode.completion, mode.single_launch_graphs);
    auto context = Context("counted", 25);
    ASSERT_NE(context, nullptr);
    auto a = *context->Allocate(n * 4), b = *context->Allocate(n * 4),
         y = *context->Allocate(n * 4);
    const PerJob one = per_job(*context, {Step{add, {a, b}, {y}}});
    const PerJob ten = per_job(*context, std::vector<Step>(10, Step{add, {a, b}, {y}}));
    std::printf(
        "driver calls per job (%s%s): launch %.1f (+ %.1f polling), 10-step program %.1f (+ "
        "%.1f)\n",
        mode.completion, mode.single_launch_graphs ? ", single launches as graphs" : "",
        one.budgeted, one.polling, ten.budgeted, ten.polling);
    EXPECT_LE(one.budgeted, mode.launch_budget) << "per job, by entry point:\n" << one.detail;
    EXPECT_LE(ten.budgeted, mode.program_budget) << "per job, by entry point:\n" << ten.detail;
    a.reset();
    b.reset();
    y.reset();
    context.reset();
    backend_.reset();
  }
}

// The spinning completion thread spins only while jobs are in flight: with none, it sleeps
// (its CPU time over half a second stays a small fraction of it, where a thread that kept
// polling would use all of it), and a job enqueued then is still seen.
TEST_F(FakeCudaTest, TheSpinningCompletionThreadSleepsWhileNoJobIsInFlight) {
  Cuda();
  auto context = Context("idle", 25);
  ASSERT_NE(context, nullptr);
  auto add =
      *kernels::Registry::Global().Prepare("add", {{DType::kF32, {256}}, {DType::kF32, {256}}}, {});
  auto a = *context->Allocate(1024), y = *context->Allocate(1024);
  ASSERT_TRUE(RunJob(*context, {Step{add, {a, a}, {y}}}).ok());
  const std::optional<clockid_t> clock = testing::ThreadClock("cuda-completion");
  ASSERT_TRUE(clock.has_value()) << "no thread named cuda-completion";
  auto cpu_seconds = [&] { return testing::ClockSeconds(*clock); };
  absl::SleepFor(absl::Milliseconds(100));  // past the spin and the backoff
  const double before = cpu_seconds();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_LT(cpu_seconds() - before, 0.05) << "the completion thread kept running while idle";
  ASSERT_TRUE(RunJob(*context, {Step{add, {a, a}, {y}}}).ok());
}

// ---- programs as CUDA graphs -------------------------------------------------------------

// Calls of driver entry point `name` so far (tessera_fake_cuda_calls).
long DriverCalls(testing::FakeCudaDriver& fake, absl::string_view name) {
  std::string text;
  fake.Calls(&text);
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.first == name) return std::stol(std::string(parts.second));
  }
  return 0;
}

std::vector<float> Read(TenantContext& context, const std::shared_ptr<DeviceBuffer>& b) {
  std::vector<float> out(b->size() / 4);
  EXPECT_TRUE(context.CopyOut(*b, 0, out.data(), b->size()).ok());
  return out;
}

std::shared_ptr<DeviceBuffer> Filled(TenantContext& context, const std::vector<float>& values) {
  auto b = *context.Allocate(values.size() * 4);
  EXPECT_TRUE(context.CopyIn(*b, 0, values.data(), values.size() * 4).ok());
  return b;
}

// A program of several steps (element-wise kernels and a cuBLAS matmul) runs step by step the
// first time, is captured as a graph the second time, and is then replayed: as it is while
// its tensors stay the same, with its nodes updated when they or its attributes change. Every
// run computes what the steps say.
TEST_F(FakeCudaTest, AProgramRunsAsACudaGraphFromItsSecondRun) {
  Cuda();
  auto context = Context("graphs", 50);
  ASSERT_NE(context, nullptr);
  const int64_t n = 4;
  const kernels::Registry& reg = kernels::Registry::Global();
  const TensorMeta m{DType::kF32, {n, n}};
  auto program = [&](double alpha, std::shared_ptr<DeviceBuffer> x,
                     std::shared_ptr<DeviceBuffer> y) {
    // t = alpha * x + 1; y = t @ x (identity: y = t); y = y + x
    auto scale = *reg.Prepare("scale", {m}, {{"alpha", alpha}, {"beta", 1.0}});
    auto matmul = *reg.Prepare("matmul", {m, m}, {});
    auto add = *reg.Prepare("add", {m, m}, {});
    auto t = *context->Allocate(n * n * 4);
    return std::vector<Step>{Step{scale, {x}, {t}}, Step{matmul, {t, x}, {y}},
                             Step{add, {y, x}, {y}}};
  };
  std::vector<float> identity(n * n, 0.0f);
  for (int64_t i = 0; i < n; ++i) identity[i * n + i] = 1.0f;
  // With x = I: y = (alpha * I + 1) @ I + I.
  auto expected = [&](double alpha) {
    std::vector<float> want(n * n);
    for (int64_t i = 0; i < n * n; ++i) {
      want[i] = static_cast<float>(alpha * identity[i] + 1.0) + identity[i];
    }
    return want;
  };
  auto x = Filled(*context, identity);
  auto y = *context->Allocate(n * n * 4);
  // The scratch tensor t is allocated per program here, so keep one set for the same-address
  // runs.
  std::vector<Step> same = program(2.0, x, y);
  auto runs = [&](const char* what) { return DriverCalls(*fake_, what); };
  ASSERT_TRUE(RunJob(*context, same).ok());  // step by step
  EXPECT_EQ(Read(*context, y), expected(2.0));
  EXPECT_EQ(runs("cuStreamBeginCapture"), 0);
  ASSERT_TRUE(RunJob(*context, same).ok());  // captured, instantiated, launched
  EXPECT_EQ(Read(*context, y), expected(2.0));
  EXPECT_EQ(runs("cuStreamBeginCapture"), 1);
  EXPECT_EQ(runs("cuGraphInstantiateWithFlags"), 1);
  EXPECT_EQ(runs("cuGraphLaunch"), 1);
  const long launches = runs("cuLaunchKernel");
  for (int i = 0; i < 3; ++i) {  // replayed as it is: no capture, no kernel launch
    ASSERT_TRUE(RunJob(*context, same).ok());
    EXPECT_EQ(Read(*context, y), expected(2.0));
  }
  EXPECT_EQ(runs("cuStreamBeginCapture"), 1);
  EXPECT_EQ(runs("cuGraphLaunch"), 4);
  EXPECT_EQ(runs("cuLaunchKernel"), launches);
  // Other tensors: captured again and the graph updated in place.
  auto y2 = *context->Allocate(n * n * 4);
  ASSERT_TRUE(RunJob(*context, program(2.0, x, y2)).ok());
  EXPECT_EQ(Read(*context, y2), expected(2.0));
  EXPECT_EQ(runs("cuGraphExecUpdate"), 1);
  EXPECT_EQ(runs("cuGraphInstantiateWithFlags"), 1);
  // Another alpha is another program: run step by step once, then a graph of its own.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(RunJob(*context, program(-3.0, x, y)).ok());
    EXPECT_EQ(Read(*context, y), expected(-3.0));
  }
  EXPECT_EQ(runs("cuGraphInstantiateWithFlags"), 2);
  // On another stream, the matmul's node would use that stream's cuBLAS workspace: another
  // program too.
  ASSERT_TRUE(testing::RunSteps(*context, same, 1).ok());
  EXPECT_EQ(Read(*context, y), expected(2.0));
  EXPECT_EQ(runs("cuGraphInstantiateWithFlags"), 2);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kGraph).live, 0) << "a captured graph was kept";
  EXPECT_EQ(fake_->tally(FakeCudaKind::kGraphExec).live, 2);
  same.clear();  // the tensors go before their context (backend.h)
  x.reset();
  y.reset();
  y2.reset();
  context.reset();
  EXPECT_EQ(fake_->tally(FakeCudaKind::kGraphExec).live, 0) << "graphs outlived their context";
}

// Single launches stay kernel launches by default; with --cuda_single_launch_graphs one is
// captured at its second run and replayed from then on (a catalog element-wise kernel and a
// cuBLAS matmul alike), computing the same results, within the same driver-call budget.
TEST_F(FakeCudaTest, ASingleLaunchRunsAsAGraphOnlyWhenAskedTo) {
  const kernels::Registry& reg = kernels::Registry::Global();
  const int64_t n = 4;
  const TensorMeta m{DType::kF32, {n, n}};
  std::vector<float> identity(n * n, 0.0f);
  for (int64_t i = 0; i < n; ++i) identity[i * n + i] = 1.0f;
  for (bool as_graphs : {false, true}) {
    SCOPED_TRACE(as_graphs ? "single launches as graphs" : "default");
    Cuda("auto", {}, "spin", as_graphs);
    auto context = Context("single", 50);
    ASSERT_NE(context, nullptr);
    auto x = Filled(*context, identity);
    auto y = *context->Allocate(n * n * 4);
    auto add = *reg.Prepare("add", {m, m}, {});
    auto matmul = *reg.Prepare("matmul", {m, m}, {});
    std::vector<float> doubled = identity;
    for (float& v : doubled) v *= 2;
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(RunJob(*context, {Step{add, {x, x}, {y}}}).ok());
      EXPECT_EQ(Read(*context, y), doubled) << "run " << i;
      ASSERT_TRUE(RunJob(*context, {Step{matmul, {x, x}, {y}}}).ok());
      EXPECT_EQ(Read(*context, y), identity) << "run " << i;
    }
    // Two launches, each captured at its second run and replayed twice after.
    EXPECT_EQ(DriverCalls(*fake_, "cuStreamBeginCapture"), as_graphs ? 2 : 0);
    EXPECT_EQ(DriverCalls(*fake_, "cuGraphLaunch"), as_graphs ? 6 : 0);
    EXPECT_EQ(fake_->tally(FakeCudaKind::kGraphExec).live, as_graphs ? 2 : 0);
    x.reset();
    y.reset();
    context.reset();
    backend_.reset();
  }
}

// A program whose step writes over its own input goes through a temporary (TempSlots) and is
// never captured (its temporaries are the job's, not the graph's); a tenant's graphs are
// bounded, the least recently used evicted.
TEST_F(FakeCudaTest, ATenantsGraphsAreBoundedAndInPlaceProgramsRunStepByStep) {
  Cuda();
  auto context = Context("bounded", 50);
  ASSERT_NE(context, nullptr);
  const kernels::Registry& reg = kernels::Registry::Global();
  const TensorMeta m{DType::kF32, {8, 8}};
  auto x = Filled(*context, std::vector<float>(64, 1.0f));
  auto y = *context->Allocate(64 * 4);
  auto transpose = *reg.Prepare("transpose", {m}, {});
  const std::vector<Step> in_place = {Step{transpose, {x}, {x}}, Step{transpose, {x}, {x}}};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(RunJob(*context, in_place).ok());
  EXPECT_EQ(DriverCalls(*fake_, "cuStreamBeginCapture"), 0);
  constexpr long kBound = 32;  // kMaxProgramsPerContext (server/backend/cuda/cuda_context.h)
  const int programs = kBound + 4;
  for (int k = 0; k < programs; ++k) {
    auto scale = *reg.Prepare("scale", {m}, {{"alpha", 1.0}, {"beta", static_cast<double>(k)}});
    const std::vector<Step> steps = {Step{scale, {x}, {y}}, Step{scale, {y}, {y}}};
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(RunJob(*context, steps).ok());
      EXPECT_EQ(Read(*context, y)[0], 1.0f + 2 * k) << "program " << k;
    }
  }
  EXPECT_EQ(DriverCalls(*fake_, "cuGraphInstantiateWithFlags"), programs);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kGraphExec).live, kBound);
}

// ---- a real server process on the fake GPU --------------------------------------------------

absl::StatusOr<std::unique_ptr<Client>> ConnectTo(const testing::ServerProcess& server,
                                                  const std::string& token) {
  return Client::Connect(
      {.address = server.address(), .token = token, .timeout = absl::Seconds(20)});
}

TEST_F(FakeCudaTest, TheServerServesOnTheFakeGpuEndToEnd) {
  testing::TempDir dir;
  auto server = testing::ServerProcess::Start(
      {.state_dir = dir.File("var"), .args = {"--backend=cuda", "--log_level=warn"}});
  ASSERT_TRUE(server.ok()) << server.status();
  auto admin = ConnectTo(**server, (*server)->AdminToken());
  ASSERT_TRUE(admin.ok()) << admin.status();
  auto info = (*admin)->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "cuda") << info->backend_reason();
  ASSERT_EQ(info->devices_size(), 1);
  EXPECT_EQ(info->devices(0).name(), "Tessera fake GPU 0");
  EXPECT_EQ(info->devices(0).compute_units(), 132u);

  v1::RegisterTenantRequest request;
  request.set_tenant_id("gpu-tenant");
  request.mutable_quota()->set_device_memory_bytes(1ull << 30);
  request.mutable_quota()->set_compute_share_percent(25);
  auto registered = (*admin)->RegisterTenant(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->tenant().context().kind(), v1::CONTEXT_KIND_GREEN);
  EXPECT_TRUE(registered->tenant().context().compute_share_enforced());
  EXPECT_THAT(registered->tenant().context().reason(), HasSubstr("granted 40 SMs"));

  auto tenant = ConnectTo(**server, registered->api_key());
  ASSERT_TRUE(tenant.ok());
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(2);
  spec.add_shape(3);
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  auto x = (*tenant)->CreateTensor(
      spec, std::string(reinterpret_cast<const char*>(a.data()), a.size() * 4));
  ASSERT_TRUE(x.ok()) << x.status();
  v1::LaunchRequest launch;
  launch.set_kernel("add");
  launch.add_inputs(x->handle());
  launch.add_inputs(x->handle());
  launch.set_wait(true);
  auto job = (*tenant)->Launch(launch);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->DebugString();
  ASSERT_EQ(job->outputs_size(), 1);
  auto bytes = (*tenant)->Download(job->outputs(0).handle());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::vector<float> sum(6);
  ASSERT_EQ(bytes->size(), 24u);
  std::memcpy(sum.data(), bytes->data(), 24);
  EXPECT_EQ(sum, (std::vector<float>{2, 4, 6, 8, 10, 12}));

  // An orderly shutdown gives everything back: the fake in the server process prints its
  // misuses as they happen and its leaks at exit.
  auto stopped = (*server)->Stop(SIGTERM);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0) << (*server)->output();
  EXPECT_THAT((*server)->output(), Not(HasSubstr("fake libcuda: misuse")));
  EXPECT_THAT((*server)->output(), Not(HasSubstr("fake libcuda: leak")));
}

// A fault that CUDA makes fatal to the process (an illegal address): the job fails saying
// the server restarts, the server exits 75 by itself (for systemd's Restart=on-failure or the
// kubelet), and a restarted server has every tenant back.
TEST_F(FakeCudaTest, AFatalGpuFaultEndsTheServerWhichComesBackWithItsTenants) {
  testing::TempDir dir;
  testing::ServerProcess::Options options{.state_dir = dir.File("var"),
                                          .args = {"--backend=cuda", "--log_level=warn"}};
  options.env["TESSERA_FAKE_CUDA_FAULT_KERNEL"] = "tessera_unary_f32";
  auto server = testing::ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto admin = ConnectTo(**server, (*server)->AdminToken());
  ASSERT_TRUE(admin.ok()) << admin.status();
  v1::RegisterTenantRequest request;
  request.set_tenant_id("doomed");
  request.mutable_quota()->set_device_memory_bytes(1ull << 30);
  auto registered = (*admin)->RegisterTenant(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  auto tenant = ConnectTo(**server, registered->api_key());
  ASSERT_TRUE(tenant.ok());
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(4);
  auto x = (*tenant)->CreateTensor(spec);
  ASSERT_TRUE(x.ok()) << x.status();
  v1::LaunchRequest launch;
  launch.set_kernel("neg");
  launch.add_inputs(x->handle());
  launch.set_wait(true);
  auto job = (*tenant)->Launch(launch);
  // The job fails (or, if the server is already going, the call does), saying why.
  if (job.ok()) {
    EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << job->DebugString();
    EXPECT_EQ(job->error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
    EXPECT_THAT(job->error_message(), HasSubstr("the server restarts"));
  } else {
    EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable) << job.status();
  }
  auto exited = (*server)->WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(exited.ok()) << exited.status() << (*server)->output();
  EXPECT_EQ(*exited, 75) << (*server)->output();
  EXPECT_THAT((*server)->output(), HasSubstr("fatal fault on GPU 0 (CUDA_ERROR_ILLEGAL_ADDRESS)"));

  // The supervisor's restart: the tenant is there and its work runs.
  options.env.erase("TESSERA_FAKE_CUDA_FAULT_KERNEL");
  auto again = testing::ServerProcess::Start(options);
  ASSERT_TRUE(again.ok()) << again.status();
  auto back = ConnectTo(**again, registered->api_key());
  ASSERT_TRUE(back.ok());
  auto y = (*back)->CreateTensor(spec);
  ASSERT_TRUE(y.ok()) << y.status();
  launch.set_inputs(0, y->handle());
  auto rerun = (*back)->Launch(launch);
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(rerun->state(), v1::JOB_STATE_SUCCEEDED) << rerun->DebugString();
  auto stopped = (*again)->Stop(SIGTERM);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0) << (*again)->output();
}

}  // namespace
}  // namespace tessera
