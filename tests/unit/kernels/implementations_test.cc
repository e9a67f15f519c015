// Every catalog kernel has an implementation in every backend: the catalog holds one kernel
// per Op, and each backend's switch over Op (kernels/cpu/cpu_kernels.cc,
// server/backend/cuda/ops.cc) implements each one, on the CUDA side for every dtype the
// catalog accepts. Runs on any host: the CUDA side is checked as data, without a device.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/registry.h"
#include "server/backend/cuda/ops.h"

namespace tessera::kernels {
namespace {

using ::testing::Contains;

const std::vector<KernelDef>& Catalog() { return Registry::Global().kernels(); }

TEST(ImplementationsTest, CatalogHasOneKernelPerOp) {
  std::set<int> seen;
  for (const KernelDef& k : Catalog()) {
    const int op = static_cast<int>(k.op);
    EXPECT_TRUE(op >= 0 && op < kNumOps) << k.name << " has op " << op << "; kNumOps is " << kNumOps
                                         << " (is the new op last in the enum?)";
    EXPECT_TRUE(seen.insert(op).second) << k.name << " shares op " << op << " with another kernel";
  }
  EXPECT_EQ(Catalog().size(), static_cast<size_t>(kNumOps)) << "an Op has no catalog kernel";
}

TEST(ImplementationsTest, EveryCatalogKernelHasACpuAndACudaImplementation) {
  for (const KernelDef& k : Catalog()) {
    EXPECT_TRUE(CpuImplements(k.op)) << k.name << " has no CPU implementation";
    EXPECT_TRUE(cuda::CudaImplements(k.op)) << k.name << " has no CUDA implementation";
  }
}

// The CUDA kernels are instantiated per dtype: each dtype the catalog accepts must name an
// entry point that the fatbins export (and the module resolves when it loads).
TEST(ImplementationsTest, EveryCatalogDtypeHasACudaEntryPoint) {
  const std::vector<std::string>& exported = cuda::FatbinEntryPoints();
  for (const KernelDef& k : Catalog()) {
    const cuda::CudaImpl impl = cuda::CudaImplOf(k.op);
    const std::vector<DType>& dtypes = k.inputs.empty() ? k.outputs[0].dtypes : k.inputs[0].dtypes;
    for (DType d : dtypes) {
      const std::string entry = cuda::EntryPointOf(impl.launcher, d);
      if (impl.launcher == cuda::CudaLauncher::kCopy) {
        EXPECT_EQ(entry, "") << k.name;  // a device-to-device copy, no kernel
        continue;
      }
      EXPECT_THAT(exported, Contains(entry)) << k.name << " for " << DTypeName(d);
    }
  }
}

// What the tests above rely on: a value outside the switches has no implementation.
TEST(ImplementationsTest, AValueOutsideTheOpsHasNoImplementation) {
  const Op unknown = static_cast<Op>(static_cast<int>(Op::kUser) + 1);
  EXPECT_FALSE(CpuImplements(unknown));
  EXPECT_FALSE(cuda::CudaImplements(unknown));
}

// Tenant-defined kernels are not catalog ops: the CPU backend runs the plan's own program
// (RunCpuKernel), the CUDA backend generated code (its kUser launcher).
TEST(ImplementationsTest, UserKernelsAreDispatchedOutsideTheCatalog) {
  EXPECT_EQ(static_cast<int>(Op::kUser), kNumOps);
  EXPECT_FALSE(CpuImplements(Op::kUser));
  EXPECT_TRUE(cuda::CudaImplements(Op::kUser));
}

}  // namespace
}  // namespace tessera::kernels
