#include "server/backend/select.h"

#include <dlfcn.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/cpu/cpu_backend.h"
#include "server/backend/cuda_module.h"
#include "tests/testing/sizes.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

using testing::kGiB;

TEST(SelectBackendTest, CpuWhenAskedWithTheConfiguredCapacity) {
  auto choice = SelectBackend(
      {.backend = "cpu", .mps = "auto", .cpu_memory_bytes = 3 * kGiB, .cpu_threads = 5});
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->backend->name(), "cpu");
  EXPECT_EQ(choice->reason, "--backend=cpu");
  ASSERT_EQ(choice->backend->devices().size(), 1u);
  EXPECT_EQ(choice->backend->devices()[0].memory_bytes, 3 * kGiB);
  EXPECT_EQ(choice->backend->devices()[0].compute_units, 5u);
  EXPECT_EQ(choice->backend->mps().decision, MpsDecision::kNotApplicable);
}

TEST(SelectBackendTest, DefaultCapacityIsHalfOfPhysicalMemory) {
  auto choice = SelectBackend({.backend = "cpu"});
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->backend->devices()[0].memory_bytes, PhysicalMemoryBytes() / 2);
  EXPECT_GT(choice->backend->devices()[0].compute_units, 0u);
}

TEST(SelectBackendTest, AutoFallsBackToCpuAndSaysWhy) {
  auto choice = SelectBackend({.backend = "auto"});
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->backend->name(), "cpu");
  EXPECT_THAT(choice->reason, HasSubstr("--backend=auto: "));
}

TEST(SelectBackendTest, CudaWithoutACudaBackendIsAStartupError) {
  absl::Status s = SelectBackend({.backend = "cuda"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--backend=cuda"));
}

TEST(SelectBackendTest, MpsRequireWithoutMpsIsAStartupError) {
  absl::Status s = SelectBackend({.backend = "cpu", .mps = "require"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--mps=require"));
  EXPECT_TRUE(SelectBackend({.backend = "cpu", .mps = "off"}).ok());
}

TEST(SelectBackendTest, UnknownValuesNameTheFlag) {
  EXPECT_THAT(SelectBackend({.backend = "tpu"}).status().message(), HasSubstr("--backend=tpu"));
  EXPECT_THAT(SelectBackend({.mps = "maybe"}).status().message(), HasSubstr("--mps=maybe"));
}

#ifdef TESSERA_CUDA_MODULE_PATH
// The CUDA module loads on any host (cuBLAS is its only CUDA dependency; the driver is
// dlopen'ed at run time) and, without a driver, refuses with the reason.
TEST(CudaModuleTest, LoadsAnywhereAndSaysWhyItCannotRunWithoutADriver) {
  void* module = dlopen(TESSERA_CUDA_MODULE_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(module, nullptr) << dlerror();
  auto entry = reinterpret_cast<CudaModuleEntry>(dlsym(module, kCudaModuleEntry));
  ASSERT_NE(entry, nullptr);
  EXPECT_NE(dlsym(module, kCudaModuleInjectFault), nullptr);
  absl::StatusOr<std::unique_ptr<Backend>> backend;
  entry(CudaModuleOptions{.mps = "off"}, &backend);
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver != nullptr) {
    dlclose(driver);
    GTEST_SKIP() << "this host has a CUDA driver; the gpu-labelled tests cover the module";
  }
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(backend.status().message(), HasSubstr("libcuda.so.1"));
}
#endif

}  // namespace
}  // namespace tessera
