// GPU tests (ctest label `gpu`): the CUDA backend module against the CPU backend's results
// for the whole kernel catalog, plus contexts, streams, quotas, registered host memory (a
// region's transfers) and fault containment. Every test skips, saying why, where the CUDA
// backend cannot run (no driver, no GPU, no module).
// On the fake driver (tests/fake_cuda/driver) each test also ends with no driver misuse and
// no object the backend did not give back.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "kernels/dtype.h"
#include "kernels/registry.h"
#include "server/backend/cpu/cpu_backend.h"
#include "server/backend/cuda_module.h"
#include "server/backend/select.h"
#include "server/common/shared_memory.h"
#include "tests/fake_cuda/driver/fake_cuda.h"
#include "tests/testing/catalog_cases.h"
#include "tests/testing/context_runner.h"

namespace tessera {
namespace {

using kernels::DType;
using kernels::TensorMeta;

// One tenant context and the helpers of tests/testing/context_runner.h.
struct Runner {
  std::unique_ptr<TenantContext> context;

  absl::StatusOr<std::vector<testing::HostTensor>> Run(
      const kernels::Plan& plan, const std::vector<testing::HostTensor>& inputs, int stream = 0) {
    return testing::RunPlan(*context, plan, inputs, stream);
  }
  absl::Status Wait(int stream, std::vector<Step> steps) {
    return testing::RunSteps(*context, std::move(steps), stream);
  }
};

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // On the fake, all tests run in one process: each counts from before its backend loads.
    if (auto fake = testing::FakeCudaDriver::Loaded()) fake->Reset();
    absl::StatusOr<BackendChoice> choice = SelectBackend({.backend = "cuda", .mps = "auto"});
    if (!choice.ok()) {
      // Where a device is promised (the fake driver's run in CI), not finding one is a failure.
      if (std::getenv("TESSERA_GPU_TESTS_REQUIRE_DEVICE") != nullptr) {
        FAIL() << "no CUDA backend: " << choice.status().message();
      }
      GTEST_SKIP() << "no CUDA backend here: " << choice.status().message();
    }
    gpu_ = std::move(choice->backend);
    fake_ = testing::FakeCudaDriver::Loaded();  // empty on NVIDIA's driver
    cpu_ = std::make_unique<CpuBackend>(
        CpuBackend::Options{.memory_bytes = 4ull << 30, .worker_threads = 4, .reason = "test"});
  }

  void TearDown() override {
    gpu_.reset();
    if (!fake_) return;
    // The fake driver counts misuse and what the backend, now gone, did not give back.
    EXPECT_EQ(fake_->misuses(), 0) << "driver API misuse (see stderr)";
    std::string report;
    EXPECT_EQ(fake_->Leaks(&report), 0) << "driver objects the backend did not give back:\n"
                                        << report;
  }

  Runner Gpu(uint32_t share = 50, uint32_t streams = 2, const std::string& id = "gpu-tenant") {
    auto context = gpu_->CreateContext({id, testing::TestQuota(share, streams), 0});
    EXPECT_TRUE(context.ok()) << context.status();
    return Runner{context.ok() ? *std::move(context) : nullptr};
  }
  Runner Cpu() { return Runner{*cpu_->CreateContext({"cpu-tenant", testing::TestQuota(), 0})}; }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<CpuBackend> cpu_;
  std::optional<testing::FakeCudaDriver> fake_;
};

// ---- the catalog against the CPU backend ----------------------------------------------------

TEST_F(GpuTest, EveryCatalogKernelMatchesTheCpuBackend) {
  Runner gpu = Gpu();
  Runner cpu = Cpu();
  ASSERT_NE(gpu.context, nullptr);
  std::mt19937 rng(7);
  int checked = 0;
  const std::vector<testing::CatalogCase> cases = testing::CatalogCases();
  for (const testing::CatalogCase& c : cases) {
    SCOPED_TRACE(c.label);
    absl::StatusOr<kernels::Plan> plan =
        kernels::Registry::Global().Prepare(c.kernel, c.inputs, c.attrs);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<testing::HostTensor> inputs = testing::RandomInputs(*plan, c.kernel, rng);
    double max_abs = 0;
    for (const testing::HostTensor& t : inputs) {
      for (int64_t i = 0; i < t.size(); ++i) max_abs = std::max(max_abs, std::abs(t.Get(i)));
    }
    auto want = cpu.Run(*plan, inputs);
    auto got = gpu.Run(*plan, inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t o = 0; o < plan->outputs.size(); ++o) {
      const TensorMeta& meta = plan->outputs[o];
      const int64_t n = (*want)[o].size();
      int mismatches = 0;
      for (int64_t i = 0; i < n && mismatches < 5; ++i) {
        const double w = (*want)[o].Get(i), g = (*got)[o].Get(i);
        if (!testing::Matches(*plan, meta.dtype, w, g, max_abs)) {
          ++mismatches;
          ADD_FAILURE() << "element " << i << ": cpu " << w << ", gpu " << g;
        }
      }
    }
    ++checked;
  }
  std::printf("catalog: %d cases on the CUDA backend\n", checked);
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

// ---- contexts, streams, quotas, faults --------------------------------------------------------

TEST_F(GpuTest, ContextKindFollowsTheMpsDecisionAndSaysWhy) {
  MpsState mps = gpu_->mps();
  for (uint32_t share : {25u, 100u}) {
    Runner r = Gpu(share, 1, absl::StrCat("share-", share));
    ASSERT_NE(r.context, nullptr);
    const ContextInfo& info = r.context->info();
    EXPECT_FALSE(info.reason.empty());
    if (mps.decision == MpsDecision::kMps) {
      EXPECT_EQ(info.kind, ContextKind::kMps) << info.reason;
    } else {
      EXPECT_NE(info.kind, ContextKind::kMps) << info.reason;
    }
    std::printf("share %u%%: %s: %s\n", share, std::string(ContextKindName(info.kind)).c_str(),
                info.reason.c_str());
  }
}

TEST_F(GpuTest, JobsOnOneStreamRunInOrderAndStreamsRunIndependently) {
  Runner r = Gpu(50, 2);
  ASSERT_NE(r.context, nullptr);
  const kernels::Registry& reg = kernels::Registry::Global();
  auto fill = reg.Prepare("fill", {}, {{"value", 1.0}, {"shape", std::vector<int64_t>{1 << 20}}});
  auto scale = reg.Prepare("scale", {{DType::kF32, {1 << 20}}}, {{"alpha", 2.0}, {"beta", 1.0}});
  ASSERT_TRUE(fill.ok() && scale.ok());
  auto x = *r.context->Allocate(4 << 20);
  auto y = *r.context->Allocate(4 << 20);
  // Stream 0: x = 1, then 20 times x = 2x + 1 (in place) => 2^21 - 1.
  std::vector<absl::Notification> done(2);
  std::vector<absl::Status> status(2);
  std::vector<Step> chain;
  chain.push_back(Step{*fill, {}, {x}});
  for (int i = 0; i < 20; ++i) chain.push_back(Step{*scale, {x}, {x}});
  r.context->Enqueue(0, std::move(chain), [&](ExecResult e) {
    status[0] = e.status;
    done[0].Notify();
  });
  r.context->Enqueue(1, {Step{*fill, {}, {y}}}, [&](ExecResult e) {
    status[1] = e.status;
    done[1].Notify();
  });
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(done[i].WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(status[i].ok()) << status[i];
  }
  float first = 0, last = 0;
  ASSERT_TRUE(r.context->CopyOut(*x, 0, &first, 4).ok());
  ASSERT_TRUE(r.context->CopyOut(*x, (4 << 20) - 4, &last, 4).ok());
  EXPECT_EQ(first, 2097151.0f);
  EXPECT_EQ(last, 2097151.0f);
  EXPECT_GT(r.context->busy_time(), absl::ZeroDuration());
}

// Enqueue hands a job to the device and returns: it must not wait for the device to run it,
// however long the job (the caller may hold the core's locks, and a tenant's long program
// must not stall anyone else's calls). Nor may another allocation or a small copy wait
// for it. Timed against the job's own run time, measured here.
TEST_F(GpuTest, EnqueuingALongProgramDoesNotWaitForTheDevice) {
  Runner r = Gpu(100, 1);
  ASSERT_NE(r.context, nullptr);
  const kernels::Registry& reg = kernels::Registry::Global();
  // A matmul large enough that 256 of them take a while on any device (the fake included).
  const int64_t n = fake_ ? 256 : 4096;
  auto plan = reg.Prepare("matmul", {{DType::kF32, {n, n}}, {DType::kF32, {n, n}}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const uint64_t bytes = static_cast<uint64_t>(n * n) * 4;
  auto a = *r.context->Allocate(bytes);
  auto y = *r.context->Allocate(bytes);
  ASSERT_TRUE(r.Wait(0, {Step{*plan, {a, a}, {y}}}).ok());  // warm up (cuBLAS handle)
  std::vector<Step> steps(256, Step{*plan, {a, a}, {y}});
  absl::Notification done;
  absl::Status status;
  const absl::Time start = absl::Now();
  r.context->Enqueue(0, std::move(steps), [&](ExecResult e) {
    status = e.status;
    done.Notify();
  });
  const absl::Duration enqueue = absl::Now() - start;
  auto other = r.context->Allocate(bytes);
  ASSERT_TRUE(other.ok()) << other.status();
  const absl::Duration allocate = absl::Now() - start - enqueue;
  // This context's first element-wise kernel, behind the program: a kernel the driver loads
  // lazily at its first launch would wait here for the program (1.9 s on an H100).
  auto neg = reg.Prepare("neg", {{DType::kF32, {n, n}}}, {});
  ASSERT_TRUE(neg.ok()) << neg.status();
  absl::Notification neg_done;
  const absl::Time neg_start = absl::Now();
  r.context->Enqueue(0, {Step{*neg, {a}, {*other}}}, [&](ExecResult) { neg_done.Notify(); });
  const absl::Duration first_kernel = absl::Now() - neg_start;
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(120)));
  ASSERT_TRUE(status.ok()) << status;
  const absl::Duration job = absl::Now() - start;
  ASSERT_TRUE(neg_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  std::printf(
      "256 matmuls of %lldx%lld: enqueue returned after %s, an allocation after %s "
      "more, a first element-wise kernel's enqueue after %s; the job took %s\n",
      static_cast<long long>(n), static_cast<long long>(n), absl::FormatDuration(enqueue).c_str(),
      absl::FormatDuration(allocate).c_str(), absl::FormatDuration(first_kernel).c_str(),
      absl::FormatDuration(job).c_str());
  EXPECT_LT(enqueue, job / 4);
  EXPECT_LT(enqueue + allocate, job / 2);
  EXPECT_LT(first_kernel, job / 4);
}

// Matmuls on two streams of one tenant at once: each stream has a cuBLAS workspace of its
// own (one shared workspace would be scratch memory two GEMMs write at the same time).
TEST_F(GpuTest, MatmulsOnTwoStreamsAtOnceAreBothRight) {
  Runner r = Gpu(100, 2);
  ASSERT_NE(r.context, nullptr);
  const kernels::Registry& reg = kernels::Registry::Global();
  const int64_t n = 512;
  auto fill = reg.Prepare("fill", {}, {{"value", 1.0}, {"shape", std::vector<int64_t>{n, n}}});
  auto plan = reg.Prepare("matmul", {{DType::kF32, {n, n}}, {DType::kF32, {n, n}}}, {});
  ASSERT_TRUE(fill.ok() && plan.ok());
  const uint64_t bytes = static_cast<uint64_t>(n * n) * 4;
  auto a = *r.context->Allocate(bytes);
  ASSERT_TRUE(r.Wait(0, {Step{*fill, {}, {a}}}).ok());
  std::vector<std::shared_ptr<DeviceBuffer>> outputs;
  std::vector<absl::Notification> done(2);
  std::vector<absl::Status> status(2);
  for (int stream = 0; stream < 2; ++stream) {
    outputs.push_back(*r.context->Allocate(bytes));
    r.context->Enqueue(stream, std::vector<Step>(8, Step{*plan, {a, a}, {outputs.back()}}),
                       [&, stream](ExecResult e) {
                         status[stream] = e.status;
                         done[stream].Notify();
                       });
  }
  for (int stream = 0; stream < 2; ++stream) {
    ASSERT_TRUE(done[stream].WaitForNotificationWithTimeout(absl::Seconds(60)));
    ASSERT_TRUE(status[stream].ok()) << status[stream];
    std::vector<float> y(static_cast<size_t>(n * n));
    ASSERT_TRUE(r.context->CopyOut(*outputs[stream], 0, y.data(), bytes).ok());
    EXPECT_EQ(y.front(), static_cast<float>(n));
    EXPECT_EQ(y.back(), static_cast<float>(n));
  }
}

TEST_F(GpuTest, LargeTransfersRoundTripThroughPinnedStaging) {
  Runner r = Gpu();
  ASSERT_NE(r.context, nullptr);
  const size_t bytes = (40ull << 20) + 12345;  // several staging chunks and a ragged tail
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 131 + 7);
  auto b = r.context->Allocate(bytes);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(r.context->CopyIn(**b, 0, data.data(), bytes).ok());
  std::string back(bytes, '\0');
  ASSERT_TRUE(r.context->CopyOut(**b, 0, back.data(), bytes).ok());
  EXPECT_TRUE(back == data);
  std::string part(1000, '\0');
  ASSERT_TRUE(r.context->CopyOut(**b, 9999, part.data(), part.size()).ok());
  EXPECT_EQ(part, data.substr(9999, 1000));
}

/// `size` bytes mapped as the server maps a tenant's region: a memfd sealed against
/// shrinking, mapped MAP_SHARED by SharedMemory. Null on failure.
std::unique_ptr<SharedMemory> MapRegion(uint64_t size) {
  const int fd = memfd_create("tessera-gpu-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    close(fd);
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<SharedMemory>> memory = SharedMemory::Map(fd, size);
  return memory.ok() ? *std::move(memory) : nullptr;
}

// A region registered with the context (cuMemHostRegister): a transfer inside it is one DMA
// each way from and to its pages, with no staging copy (counted on the fake). On a GPU the
// test prints both paths' rates for the same bytes, best of three (ctest -L gpu -V).
TEST_F(GpuTest, ARegisteredRegionRoundTripsWithoutStaging) {
  Runner r = Gpu();
  ASSERT_NE(r.context, nullptr);
  const size_t bytes = (40ull << 20) + 12345;
  auto region = MapRegion(2 * bytes + 4096);
  ASSERT_NE(region, nullptr);
  auto registration = r.context->RegisterHost(region->data(), region->size());
  ASSERT_TRUE(registration.ok()) << registration.status();
  ASSERT_NE(*registration, nullptr);
  char* in = region->data() + 4096;
  char* out = in + bytes;
  for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<char>(i * 131 + 7);
  auto b = r.context->Allocate(bytes);
  ASSERT_TRUE(b.ok()) << b.status();
  // Seconds of the fastest of three runs of `copy`.
  auto best = [](auto copy) {
    double fastest = 1e9;
    for (int i = 0; i < 3; ++i) {
      const absl::Time start = absl::Now();
      if (!copy().ok()) return -1.0;
      fastest = std::min(fastest, absl::ToDoubleSeconds(absl::Now() - start));
    }
    return fastest;
  };
  const double direct_in = best([&] { return r.context->CopyIn(**b, 0, in, bytes); });
  const double direct_out = best([&] { return r.context->CopyOut(**b, 0, out, bytes); });
  ASSERT_GT(direct_in, 0);
  ASSERT_GT(direct_out, 0);
  EXPECT_EQ(std::memcmp(in, out, bytes), 0);
  if (fake_) {
    const testing::FakeCudaHostCopies copies = fake_->host_copies();
    EXPECT_EQ(copies.direct_in.copies, 3);
    EXPECT_EQ(copies.direct_out.copies, 3);
    EXPECT_EQ(copies.staging_in.copies + copies.staging_out.copies, 0);
    return;  // timings on the fake mean nothing
  }
  // The same bytes from ordinary memory, through the staging buffers.
  std::string plain(in, bytes);
  const double staged_in = best([&] { return r.context->CopyIn(**b, 0, plain.data(), bytes); });
  const double staged_out = best([&] { return r.context->CopyOut(**b, 0, plain.data(), bytes); });
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf(
      "%zu bytes: registered region in %.2f GB/s, out %.2f GB/s; staged in %.2f GB/s, out %.2f "
      "GB/s\n",
      bytes, gb / direct_in, gb / direct_out, gb / staged_in, gb / staged_out);
  registration->reset();
}

TEST_F(GpuTest, AllocatingMoreThanTheDeviceHoldsIsResourceExhausted) {
  Runner r = Gpu();
  ASSERT_NE(r.context, nullptr);
  auto b = r.context->Allocate(gpu_->devices()[0].memory_bytes * 2);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_TRUE(r.context->Allocate(1 << 20).ok());  // the context is fine afterwards
}

// An illegal address is fatal to the whole process (NVIDIA: "the process must be terminated
// and relaunched"; on an H100 another context's next call and every new context failed with
// it): every tenant's work fails, their tensors are lost, nothing is rebuilt, and the backend
// tells its owner, once, so that the server exits for its supervisor to restart it.
TEST_F(GpuTest, AnIllegalAddressFailsEveryTenantAndStopsTheBackend) {
  // The module is loaded RTLD_LOCAL by SelectBackend; reopen it (already loaded) by path.
  std::string path = TESSERA_CUDA_MODULE_PATH;
  if (const char* env = std::getenv("TESSERA_CUDA_MODULE"); env != nullptr && *env != '\0') {
    path = env;
  }
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(module, nullptr) << path << " is not loaded";
  auto inject = reinterpret_cast<CudaInjectFault>(dlsym(module, kCudaModuleInjectFault));
  ASSERT_NE(inject, nullptr) << "the CUDA module's test hook was not found";
  absl::Notification stopped;
  absl::Status why;
  int calls = 0;
  gpu_->SetFatalHandler([&](const absl::Status& status) {
    why = status;
    ++calls;
    stopped.Notify();
  });
  Runner faulty = Gpu(50, 1, "faulty");
  Runner bystander = Gpu(50, 1, "bystander");
  ASSERT_NE(faulty.context, nullptr);
  ASSERT_NE(bystander.context, nullptr);
  auto lost = *faulty.context->Allocate(4096);
  auto also_lost = *bystander.context->Allocate(4096);
  const kernels::Registry& reg = kernels::Registry::Global();
  auto fill = *reg.Prepare("fill", {}, {{"value", 3.0}, {"shape", std::vector<int64_t>{1024}}});

  ASSERT_TRUE(inject(*faulty.context, 0).ok());
  absl::Status after = faulty.Wait(0, {Step{fill, {}, {lost}}});
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
  EXPECT_THAT(after.message(), ::testing::HasSubstr("the server restarts"));
  EXPECT_TRUE(lost->lost());
  float value = 0;
  EXPECT_EQ(faulty.context->CopyOut(*lost, 0, &value, 4).code(), absl::StatusCode::kDataLoss);

  ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(30)));
  std::printf("the backend stopped: %s\n", why.ToString().c_str());
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(also_lost->lost());
  absl::Status other = bystander.Wait(0, {Step{fill, {}, {also_lost}}});
  EXPECT_FALSE(other.ok());
  // Nothing is rebuilt: every use says why, and so does a new tenant's context.
  for (Runner* r : {&faulty, &bystander}) {
    auto fresh = r->context->Allocate(4096);
    EXPECT_EQ(fresh.status().code(), absl::StatusCode::kUnavailable) << fresh.status();
  }
  auto newcomer = gpu_->CreateContext({"newcomer", testing::TestQuota(50, 1), 0});
  EXPECT_EQ(newcomer.status().code(), absl::StatusCode::kUnavailable) << newcomer.status();
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tessera
