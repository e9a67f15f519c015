// "Too many resources requested for launch", caught without a GPU: each kernel's registers and
// shared memory, as ptxas reported them when nvcc built the fatbins for sm_80 and sm_90
// (kernels/CMakeLists.txt writes build/kernels/cuda/<name>.resources), against the launch
// shapes the module uses (server/backend/cuda/ops.h: MaxThreadsPerBlock) and the limits of
// compute capability 8.0 and 9.0 (CUDA C++ Programming Guide, "Compute Capabilities": 1024
// threads per block, 64K 32-bit registers per block, 255 per thread, registers allocated per
// warp in units of 256, 48 KiB of static shared memory per block).
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "kernels/dtype.h"
#include "kernels/registry.h"
#include "server/backend/cuda/ops.h"

namespace tessera::cuda {
namespace {

using ::testing::HasSubstr;

struct Usage {
  int registers = 0;
  int shared_bytes = 0;  // static
  int stack_bytes = 0;
  int spill_bytes = 0;
};

// (kernel, arch) -> usage, from ptxas's "--resource-usage" report.
using Report = std::map<std::pair<std::string, std::string>, Usage>;

Report ParseReport(const std::string& text) {
  Report report;
  static const std::regex kEntry(R"(Compiling entry function '([A-Za-z0-9_]+)' for '(sm_[0-9]+)')");
  static const std::regex kFrame(
      R"(([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads)");
  static const std::regex kUsed(R"(Used ([0-9]+) registers)");
  static const std::regex kShared(R"(([0-9]+) bytes smem)");
  std::istringstream lines(text);
  std::string line;
  Usage* current = nullptr;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (std::regex_search(line, m, kEntry)) {
      current = &report[{m[1].str(), m[2].str()}];
    } else if (current != nullptr && std::regex_search(line, m, kFrame)) {
      current->stack_bytes = std::stoi(m[1].str());
      current->spill_bytes = std::stoi(m[2].str()) + std::stoi(m[3].str());
    } else if (current != nullptr && std::regex_search(line, m, kUsed)) {
      current->registers = std::stoi(m[1].str());
      if (std::regex_search(line, m, kShared)) current->shared_bytes = std::stoi(m[1].str());
    }
  }
  return report;
}

// The limits of compute capability 8.0 and 9.0 that a launch without opt-ins meets.
constexpr int kMaxThreads = 1024;
constexpr int kMaxRegistersPerThread = 255;
constexpr int kRegistersPerBlock = 65536;
constexpr int kRegisterUnit = 256;  // registers are allocated per warp in units of this
constexpr int kStaticSharedBytes = 48 * 1024;

// Why `kernel` on `arch` cannot be launched with `threads` per block; empty if it can.
std::string Refusal(const std::string& kernel, const std::string& arch, const Usage& u,
                    int threads) {
  std::vector<std::string> why;
  if (threads > kMaxThreads) {
    why.push_back(absl::StrCat(threads, " threads per block, limit ", kMaxThreads));
  }
  if (u.registers > kMaxRegistersPerThread) {
    why.push_back(
        absl::StrCat(u.registers, " registers per thread, limit ", kMaxRegistersPerThread));
  }
  const int per_warp = (u.registers * 32 + kRegisterUnit - 1) / kRegisterUnit * kRegisterUnit;
  const int warps = (threads + 31) / 32;
  if (per_warp * warps > kRegistersPerBlock) {
    why.push_back(absl::StrCat(threads, " threads x ", u.registers,
                               " registers = ", per_warp * warps,
                               " registers per block (allocated per warp in "
                               "units of ",
                               kRegisterUnit, "), limit ", kRegistersPerBlock));
  }
  if (u.shared_bytes > kStaticSharedBytes) {
    why.push_back(
        absl::StrCat(u.shared_bytes, " bytes of static shared memory, limit ", kStaticSharedBytes));
  }
  if (why.empty()) return "";
  return absl::StrCat(kernel, " on ", arch, ": ", absl::StrJoin(why, "; "));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The most threads per block the module launches each entry point with: for every kernel of
// the catalog and dtype it accepts, the launcher the module dispatches it to (ops.h), plus the
// test fault's one thread.
std::map<std::string, int> LaunchShapes() {
  std::map<std::string, int> shapes = {{"tessera_test_fault", kTestFaultBlock}};
  for (const kernels::KernelDef& def : kernels::Registry::Global().kernels()) {
    const CudaLauncher launcher = CudaImplOf(def.op).launcher;
    const auto& dtypes = def.inputs.empty() ? def.outputs[0].dtypes : def.inputs[0].dtypes;
    for (kernels::DType d : dtypes) {
      const std::string name = EntryPointOf(launcher, d);
      if (name.empty()) continue;
      shapes[name] = std::max(shapes[name], MaxThreadsPerBlock(launcher));
    }
  }
  return shapes;
}

TEST(KernelResourcesTest, TheParserReadsPtxasReports) {
  const Report r = ParseReport(
      "ptxas info    : Compiling entry function 'tessera_norm_f64' for 'sm_80'\n"
      "ptxas info    : Function properties for tessera_norm_f64\n"
      "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 42 registers, used 1 barriers, 264 bytes smem, 416 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'tessera_fill' for 'sm_90'\n"
      "ptxas info    : Function properties for tessera_fill\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 16 registers, 396 bytes cmem[0]\n");
  ASSERT_EQ(r.size(), 2u);
  const Usage& norm = r.at({"tessera_norm_f64", "sm_80"});
  EXPECT_EQ(norm.registers, 42);
  EXPECT_EQ(norm.shared_bytes, 264);
  EXPECT_EQ(norm.stack_bytes, 8);
  EXPECT_EQ(norm.spill_bytes, 8);
  EXPECT_EQ(r.at({"tessera_fill", "sm_90"}).registers, 16);
  EXPECT_EQ(r.at({"tessera_fill", "sm_90"}).shared_bytes, 0);
}

TEST(KernelResourcesTest, ARefusalNamesTheKernelTheLimitAndTheNumbers) {
  EXPECT_EQ(Refusal("k", "sm_80", Usage{.registers = 64}, 1024), "");  // exactly 65536
  EXPECT_EQ(Refusal("tessera_reduce_f64", "sm_80", Usage{.registers = 72}, 1024),
            "tessera_reduce_f64 on sm_80: 1024 threads x 72 registers = 73728 registers per "
            "block (allocated per warp in units of 256), limit 65536");
  // 65 registers round up to 2304 per warp: 32 warps need 73728.
  EXPECT_THAT(Refusal("k", "sm_90", Usage{.registers = 65}, 1024), HasSubstr("73728"));
  EXPECT_THAT(Refusal("k", "sm_90", Usage{.registers = 16, .shared_bytes = 50000}, 256),
              HasSubstr("50000 bytes of static shared memory, limit 49152"));
  EXPECT_THAT(Refusal("k", "sm_90", Usage{.registers = 16}, 2048),
              HasSubstr("2048 threads per block, limit 1024"));
}

TEST(KernelResourcesTest, EveryLaunchTheModuleMakesFitsSm80AndSm90) {
  Report report;
  for (const char* path : {TESSERA_ELEMENTWISE_RESOURCES, TESSERA_REDUCE_RESOURCES}) {
    const std::string text = ReadFile(path);
    ASSERT_FALSE(text.empty()) << "no ptxas report at " << path;
    report.merge(ParseReport(text));
  }
  const std::map<std::string, int> shapes = LaunchShapes();
  std::set<std::string> reported;
  for (const auto& [key, usage] : report) reported.insert(key.first);
  // Every kernel the fatbins have is launched with a known shape, and every shape names one.
  std::set<std::string> fatbin(FatbinEntryPoints().begin(), FatbinEntryPoints().end());
  EXPECT_EQ(reported, fatbin);
  for (const std::string& name : reported) {
    EXPECT_TRUE(shapes.count(name) != 0) << name << " has no launch shape in ops.h";
  }
  for (const auto& [name, threads] : shapes) {
    EXPECT_TRUE(reported.count(name) != 0) << name << " is launched but not in the fatbins";
  }
  int checked = 0;
  for (const auto& [key, usage] : report) {
    const auto& [name, arch] = key;
    auto shape = shapes.find(name);
    if (shape == shapes.end()) continue;  // reported above
    EXPECT_EQ(Refusal(name, arch, usage, shape->second), "");
    if (usage.spill_bytes > 0 || usage.stack_bytes > 0) {
      std::printf("%s on %s: %d bytes of stack, %d bytes spilled\n", name.c_str(), arch.c_str(),
                  usage.stack_bytes, usage.spill_bytes);
    }
    ++checked;
  }
  std::printf("resources: %d (kernel, arch) pairs checked\n", checked);
  EXPECT_EQ(checked, static_cast<int>(2 * fatbin.size()));
}

}  // namespace
}  // namespace tessera::cuda
