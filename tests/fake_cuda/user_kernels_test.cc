// Tenant-defined kernels on the CUDA module over the fake driver (tests/fake_cuda/driver), in
// CI: a corpus of generated programs over every dtype, broadcasting and reduction axes (in CI
// a slice that holds every feature of the whole; CorpusUnderTest says how to run all), each
// compiled by the real NVRTC for sm_80 and sm_90 (the fake's two devices; the fake's kernel
// compiler runs NVRTC, then builds the same source for the host) and run through the module
// against a reference evaluation; the compile limits (a compile past its deadline fails that
// job only, compiler failures keep their status, a context closed while its kernel compiles);
// and the image cache (owner-only, keyed by architecture, a corrupt file recompiled, a restart
// served from disk). Every test ends with no driver misuse and nothing left on the device.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "kernels/cpu/parallel.h"
#include "kernels/expr/compile.h"
#include "kernels/expr/cpu_program.h"
#include "kernels/expr/user_kernel.h"
#include "kernels/registry.h"
#include "server/backend/cuda_module.h"
#include "tests/fake_cuda/driver/fake_cuda.h"
#include "tests/fake_cuda/user_kernel_corpus.h"
#include "tests/testing/context_runner.h"
#include "tests/testing/expr_math_cases.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using kernels::DType;
using kernels::expr::BinaryOp;
using kernels::expr::Combine;
using kernels::expr::Func;
using kernels::expr::Type;
using ::testing::HasSubstr;
using testing::HostTensor;

constexpr int kSm80 = 0;  // the fake's devices: TESSERA_FAKE_CUDA_CC="8.0,9.0"
constexpr int kSm90 = 1;

// A job in flight: its buffers and, once done, its status.
struct InFlight {
  std::vector<std::shared_ptr<DeviceBuffer>> outputs;
  std::vector<HostTensor> got;
  std::shared_ptr<absl::Notification> done = std::make_shared<absl::Notification>();
  std::shared_ptr<absl::Status> status = std::make_shared<absl::Status>();
};

class UserKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/tessera-no-mps", 1);
    setenv("TESSERA_FAKE_CUDA_DEVICES", "2", 1);
    setenv("TESSERA_FAKE_CUDA_CC", "8.0,9.0", 1);
    setenv("TESSERA_KERNEL_COMPILER", TESSERA_FAKE_KERNEL_COMPILER, 1);
    setenv("TESSERA_FAKE_KERNEL_COMPILER_LOG", log_.c_str(), 1);
    unsetenv("TESSERA_KERNEL_COMPILE_TIMEOUT");
  }

  void TearDown() override { ExpectClean(); }

  /// Destroys the backend, then expects no misuse and nothing left on the device.
  void ExpectClean() {
    backend_.reset();
    if (!fake_) return;
    EXPECT_EQ(fake_->misuses(), 0) << "driver API misuse (see stderr)";
    std::string report;
    EXPECT_EQ(fake_->Leaks(&report), 0) << "driver objects the backend did not give back:\n"
                                        << report;
    fake_.reset();
  }

  /// The CUDA backend on the fake's two devices (sm_80, sm_90), caching images in `cache`; the
  /// module loaded as SelectBackend loads it.
  Backend& Cuda(const std::string& cache) {
    backend_.reset();
    if (auto loaded = testing::FakeCudaDriver::Loaded()) loaded->Reset();
    static void* module = dlopen(TESSERA_CUDA_MODULE_PATH, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(module, nullptr) << dlerror();
    auto entry = reinterpret_cast<CudaModuleEntry>(dlsym(module, kCudaModuleEntry));
    absl::StatusOr<std::unique_ptr<Backend>> backend;
    entry(CudaModuleOptions{.mps = "off", .kernel_cache_dir = cache}, &backend);
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) std::abort();
    backend_ = *std::move(backend);
    fake_ = testing::FakeCudaDriver::Loaded();
    EXPECT_TRUE(fake_.has_value()) << "libcuda.so.1 is not the fake driver";
    return *backend_;
  }

  std::unique_ptr<TenantContext> Context(const std::string& tenant, int device,
                                         uint32_t streams = 4) {
    auto context = backend_->CreateContext({tenant, testing::TestQuota(50, streams), device});
    EXPECT_TRUE(context.ok()) << context.status();
    return context.ok() ? *std::move(context) : nullptr;
  }

  /// Uploads `inputs`, enqueues `plan` into fresh outputs on `stream`; Finish() waits.
  InFlight Start(TenantContext& context, const kernels::Plan& plan,
                 const std::vector<HostTensor>& inputs, int stream = 0) {
    InFlight run;
    Step step;
    step.plan = plan;
    for (const HostTensor& in : inputs) {
      auto b = context.Allocate(in.bytes.size());
      EXPECT_TRUE(b.ok()) << b.status();
      if (!in.bytes.empty()) {
        EXPECT_TRUE(context.CopyIn(**b, 0, in.data(), in.bytes.size()).ok());
      }
      step.inputs.push_back(*b);
    }
    for (const kernels::TensorMeta& out : plan.outputs) {
      run.got.emplace_back(out.dtype, out.shape);
      auto b = context.Allocate(run.got.back().bytes.size());
      EXPECT_TRUE(b.ok()) << b.status();
      step.outputs.push_back(*b);
    }
    run.outputs = step.outputs;
    std::vector<Step> steps;
    steps.push_back(std::move(step));
    context.Enqueue(stream, std::move(steps), [done = run.done, status = run.status](ExecResult r) {
      *status = r.status;
      done->Notify();
    });
    return run;
  }

  absl::Status Finish(TenantContext& context, InFlight& run,
                      absl::Duration timeout = absl::Seconds(120)) {
    if (!run.done->WaitForNotificationWithTimeout(timeout)) {
      return absl::DeadlineExceededError("the job did not finish in time");
    }
    if (!run.status->ok()) return *run.status;
    for (size_t i = 0; i < run.outputs.size(); ++i) {
      absl::Status s =
          context.CopyOut(*run.outputs[i], 0, run.got[i].data(), run.got[i].bytes.size());
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  /// NVRTC compilations the fake's compiler made so far: (architecture, entry point) each.
  std::vector<std::pair<std::string, std::string>> Compilations() const {
    std::vector<std::pair<std::string, std::string>> lines;
    std::ifstream in(log_);
    std::string word, arch, entry, bytes;
    while (in >> word >> arch >> entry >> bytes) lines.emplace_back(arch, entry);
    return lines;
  }

  testing::TempDir dir_;
  std::string log_ = dir_.File("compilations.log");
  std::unique_ptr<Backend> backend_;
  std::optional<testing::FakeCudaDriver> fake_;
};

// An element-wise kernel: y = x * sigmoid(1.702 * x) (f32), the example.
testing::UserCase Swish(const std::string& name = "swish") {
  testing::ProgramBuilder b(name);
  b.AddInput("x", DType::kF32);
  b.AddOutput("y", DType::kF32);
  const int32_t x = b.Input(0);
  b.Result(
      b.Binary(BinaryOp::kMul, x,
               b.Call(Func::kSigmoid, b.Binary(BinaryOp::kMul, b.Const(Type::kF32, 1.702), x))));
  auto kernel = testing::UserKernelOf(b.Build());
  testing::UserCase c;
  c.kernel = kernel;
  c.plan = testing::UserPlan(kernel, {{3, 5}});
  c.description = name;
  return c;
}

std::vector<HostTensor> Inputs(const kernels::Plan& plan, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  return testing::CaseInputs(plan, rng);
}

// The CPU backend's result for `plan` (its bytecode, kernels/expr/cpu_program.h).
std::vector<HostTensor> OnCpu(const kernels::expr::CpuProgram& cpu, const kernels::Plan& plan,
                              const std::vector<HostTensor>& inputs) {
  std::vector<HostTensor> outputs;
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const HostTensor& t : inputs) in.push_back(t.data());
  for (const kernels::TensorMeta& m : plan.outputs) outputs.emplace_back(m.dtype, m.shape);
  for (HostTensor& t : outputs) out.push_back(t.data());
  kernels::SerialParallel serial;
  absl::Status s = cpu.Run(plan, in, out, serial);
  EXPECT_TRUE(s.ok()) << s;
  return outputs;
}

// Whether the program calls a function whose CPU and device versions may round differently
// (the CPU backend vectorizes exp; libm's and the device's differ by their ulps).
bool UsesInexactMath(const kernels::expr::Program& program) {
  for (const kernels::expr::Node& n : program.nodes) {
    if (n.kind != kernels::expr::NodeKind::kCall) continue;
    switch (static_cast<Func>(n.op)) {
      case Func::kExp:
      case Func::kLog:
      case Func::kTanh:
      case Func::kPow:
      case Func::kSigmoid:
      case Func::kGelu:
        return true;
      default:
        break;
    }
  }
  return false;
}

// ---- The corpus ------------------------------------------------------------------------------

// The corpus: 300 programs (200 element-wise, 100 reductions) from one seed. CI runs a fixed
// slice that holds every feature of the whole (every input and output dtype, every node kind
// with its operator and type, every combine and accumulator, broadcasting, empty outputs):
// every tenth program, then greedily the ones adding most features not yet held (67 programs).
// TESSERA_USER_KERNEL_CORPUS=full runs all 300 (tests/README.md).
std::vector<testing::UserCase> CorpusUnderTest() {
  std::vector<testing::UserCase> all = testing::Corpus(200, 100, 20240611);
  const char* which = std::getenv("TESSERA_USER_KERNEL_CORPUS");
  if (which != nullptr && std::string(which) == "full") return all;
  std::vector<testing::UserCase> slice = testing::RepresentativeSlice(all, 10);
  std::set<std::string> whole, sliced;
  for (const testing::UserCase& c : all) whole.merge(testing::Features(c));
  for (const testing::UserCase& c : slice) sliced.merge(testing::Features(c));
  EXPECT_EQ(sliced, whole);
  std::printf(
      "user kernel corpus: a slice of %zu of %zu programs holding all %zu features "
      "(TESSERA_USER_KERNEL_CORPUS=full runs all)\n",
      slice.size(), all.size(), whole.size());
  return slice;
}

TEST_F(UserKernelTest, EveryProgramOfTheCorpusCompilesForSm80AndSm90AndMatchesTheReference) {
  Cuda(dir_.File("kernel-cache"));
  auto sm80 = Context("tenant-sm80", kSm80);
  auto sm90 = Context("tenant-sm90", kSm90);
  ASSERT_NE(sm80, nullptr);
  ASSERT_NE(sm90, nullptr);
  const std::vector<testing::UserCase> cases = CorpusUnderTest();
  std::mt19937 rng(7);
  struct Pending {
    const testing::UserCase* c;
    std::vector<HostTensor> inputs;
    std::vector<HostTensor> expected;
    InFlight on80, on90;
  };
  std::vector<Pending> runs;
  runs.reserve(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    Pending p{&cases[i], testing::CaseInputs(cases[i].plan, rng), {}, {}, {}};
    p.expected = testing::Reference(cases[i].plan, p.inputs);
    const int stream = static_cast<int>(i % 4);
    p.on80 = Start(*sm80, cases[i].plan, p.inputs, stream);
    p.on90 = Start(*sm90, cases[i].plan, p.inputs, stream);
    runs.push_back(std::move(p));
  }
  int matched = 0, empty = 0, on_cpu = 0;
  std::set<std::string> programs;
  for (Pending& p : runs) {
    programs.insert(p.c->kernel->program.hash);
    // The CPU backend computes the same: exactly, but for float sums and products and the
    // functions whose implementations differ in their last bits.
    auto cpu = kernels::expr::CpuProgram::Build(p.c->kernel->program);
    ASSERT_TRUE(cpu.ok()) << p.c->description << ": " << cpu.status();
    const std::vector<HostTensor> cpu_result = OnCpu(**cpu, p.c->plan, p.inputs);
    if (!UsesInexactMath(p.c->kernel->program)) {
      EXPECT_EQ(testing::Compare(p.c->plan, p.inputs, p.expected, cpu_result), "")
          << p.c->description << " on the CPU backend";
      ++on_cpu;
    }
    bool ok = true;
    for (auto [context, run, arch] :
         {std::tuple{sm80.get(), &p.on80, "sm_80"}, std::tuple{sm90.get(), &p.on90, "sm_90"}}) {
      absl::Status s = Finish(*context, *run, absl::Seconds(600));
      ASSERT_TRUE(s.ok()) << p.c->description << " on " << arch << ": " << s;
      const std::string diff = testing::Compare(p.c->plan, p.inputs, p.expected, run->got);
      EXPECT_EQ(diff, "") << p.c->description << " on " << arch << " ("
                          << kernels::MetaString(p.c->plan.outputs[0]) << ")";
      ok = ok && diff.empty();
    }
    matched += ok ? 1 : 0;
    empty += kernels::CheckedNumElements(p.c->plan.outputs[0].shape) == 0 ? 1 : 0;
  }
  // Every program went through the real NVRTC once per architecture (the image cache serves
  // the rest), and nothing else did.
  std::map<std::string, std::set<std::string>> compiled;
  for (const auto& [arch, entry] : Compilations()) compiled[arch].insert(entry);
  std::set<std::string> expected_entries;
  for (const std::string& hash : programs) expected_entries.insert("tessera_user_" + hash);
  EXPECT_EQ(compiled["sm_80"], expected_entries);
  EXPECT_EQ(compiled["sm_90"], expected_entries);
  std::printf(
      "user kernel corpus: %zu programs (%d with empty outputs); NVRTC compiled %zu for sm_80 and "
      "%zu for sm_90; %d matched the reference on both devices; %d without exp, log, tanh, pow, "
      "sigmoid or gelu also matched the CPU backend\n",
      programs.size(), empty, compiled["sm_80"].size(), compiled["sm_90"].size(), matched, on_cpu);
  EXPECT_EQ(matched, static_cast<int>(cases.size()));
}

// ---- Launches ---------------------------------------------------------------------------------

TEST_F(UserKernelTest, AnElementwiseKernelRunsInPlaceAndBesideCatalogSteps) {
  Cuda("");
  auto context = Context("tenant", kSm90);
  ASSERT_NE(context, nullptr);
  testing::UserCase swish = Swish();
  const std::vector<HostTensor> x = Inputs(swish.plan);
  // One job: b = x + x (catalog), then swish(b) written over b.
  auto add =
      kernels::Registry::Global().Prepare("add", {swish.plan.inputs[0], swish.plan.inputs[0]}, {});
  ASSERT_TRUE(add.ok()) << add.status();
  auto xb = context->Allocate(x[0].bytes.size());
  auto b = context->Allocate(x[0].bytes.size());
  ASSERT_TRUE(xb.ok() && b.ok());
  ASSERT_TRUE(context->CopyIn(**xb, 0, x[0].data(), x[0].bytes.size()).ok());
  std::vector<Step> steps;
  steps.push_back(Step{*add, {*xb, *xb}, {*b}});
  steps.push_back(Step{swish.plan, {*b}, {*b}});
  ASSERT_TRUE(testing::RunSteps(*context, std::move(steps)).ok());
  HostTensor got(DType::kF32, {3, 5});
  ASSERT_TRUE(context->CopyOut(**b, 0, got.data(), got.bytes.size()).ok());
  HostTensor doubled(DType::kF32, {3, 5});
  for (int64_t i = 0; i < 15; ++i) doubled.Set(i, x[0].Get(i) * 2);
  const std::vector<HostTensor> want = testing::Reference(swish.plan, {doubled});
  EXPECT_EQ(testing::Compare(swish.plan, {doubled}, want, {got}), "");
}

TEST_F(UserKernelTest, AReductionOverEachAxisSetOfARank3Tensor) {
  Cuda("");
  auto context = Context("tenant", kSm90);
  ASSERT_NE(context, nullptr);
  // mean of x * w over the axes, with x f16[4, 1, 6] and w bf16[5, 1] broadcasting to [4, 5, 6].
  testing::ProgramBuilder b("masked_mean");
  b.AddInput("x", DType::kF16);
  b.AddInput("w", DType::kBF16);
  b.AddOutput("y", DType::kF32);
  b.Reduce(Combine::kSum, b.Binary(BinaryOp::kMul, b.Input(0), b.Input(1)));
  b.Result(b.Binary(BinaryOp::kDiv, b.Reduced(), b.Cast(b.Count(), Type::kF32)));
  auto kernel = testing::UserKernelOf(b.Build());
  for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{
           {}, {0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}, {-1}}) {
    for (bool keepdims : {false, true}) {
      kernels::Plan plan =
          testing::UserPlan(kernel, {{4, 1, 6}, {5, 1}}, {{"axes", axes}, {"keepdims", keepdims}});
      const std::vector<HostTensor> in = Inputs(plan, 3);
      InFlight run = Start(*context, plan, in);
      ASSERT_TRUE(Finish(*context, run).ok()) << *run.status;
      EXPECT_EQ(testing::Compare(plan, in, testing::Reference(plan, in), run.got), "")
          << "axes " << axes.size() << " keepdims " << keepdims;
    }
  }
}

// Definitions as tenants write them, checked by kernels::expr::Compile, give the CPU backend's
// results on both devices.
TEST_F(UserKernelTest, DefinitionsCompiledByTheCheckerMatchTheCpuBackend) {
  Cuda("");
  auto sm80 = Context("tenant-sm80", kSm80);
  auto sm90 = Context("tenant-sm90", kSm90);
  ASSERT_NE(sm80, nullptr);
  ASSERT_NE(sm90, nullptr);
  struct Source {
    std::string text;
    std::vector<kernels::Shape> shapes;
    kernels::Attrs attrs;
  };
  const std::vector<Source> sources = {
      {"kernel swish(x: f32) -> (y: f32) {\n  y = x * sigmoid(1.702 * x)\n}", {{4, 33}}, {}},
      {"kernel fused(x: f16, w: f32, b: bf16) -> (y: f16, r: f32) params(alpha: float = 0.5)\n"
       "{\n  let z = x * w + b\n  y = gelu(z) * alpha\n  r = maximum(relu(z), -1.0)\n}",
       {{3, 1, 8}, {8}, {5, 1}},
       {}},
      {"kernel ints(a: i32, b: i64, c: u8) -> (q: i64, m: i32, t: bool)\n{\n"
       "  q = a / b + c\n  m = a % b - c * 3\n  t = a > b || c == 7\n}",
       {{6, 4}, {4}, {6, 1}},
       {}},
      {"kernel rms(x: bf16) -> (y: f32) params(eps: float = 1e-6)\n{\n"
       "  y = sqrt(sum(x * x) / count + eps)\n}",
       {{4, 5, 6}},
       {{"axes", std::vector<int64_t>{-1}}}},
      {"kernel first_max(x: f64, w: f64) -> (i: i64)\n{\n  i = argmax(x * w)\n}",
       {{7, 9}, {9}},
       {{"axes", std::vector<int64_t>{0}}, {"keepdims", true}}},
      {"kernel where_cast(x: f32, k: i64) -> (y: u8)\n{\n"
       "  y = where(x > 0.5, k, i64(x * 100.0))\n}",
       {{2, 3, 4}, {1, 4}},
       {}},
  };
  std::mt19937 rng(5);
  for (const Source& src : sources) {
    auto definition = kernels::expr::ParseSource(src.text);
    ASSERT_TRUE(definition.ok()) << definition.status() << "\n" << src.text;
    auto kernel = kernels::expr::MakeUserKernel(*std::move(definition));
    ASSERT_TRUE(kernel.ok()) << kernel.status() << "\n" << src.text;
    std::vector<kernels::TensorMeta> metas;
    for (size_t k = 0; k < src.shapes.size(); ++k) {
      metas.push_back({(*kernel)->program.definition.inputs[k].dtype, src.shapes[k]});
    }
    auto plan = kernels::PrepareKernel((*kernel)->def, metas, src.attrs);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan->user = *kernel;
    const std::vector<HostTensor> in = testing::CaseInputs(*plan, rng);
    const std::vector<HostTensor> cpu = OnCpu(*(*kernel)->cpu, *plan, in);
    const bool exact = !UsesInexactMath((*kernel)->program);
    for (TenantContext* context : {sm80.get(), sm90.get()}) {
      InFlight run = Start(*context, *plan, in);
      ASSERT_TRUE(Finish(*context, run).ok()) << *run.status << "\n" << src.text;
      EXPECT_EQ(testing::Compare(*plan, in, testing::Reference(*plan, in), run.got), "")
          << src.text;
      if (exact) {
        EXPECT_EQ(testing::Compare(*plan, in, cpu, run.got), "") << src.text;
      }
    }
  }
}

// The C-library functions of the language (sin ... isfinite) as the generated CUDA computes
// them, over the edge values and random values that the CPU backend's accuracy test uses
// (tests/testing/expr_math_cases.h), within kernels/accuracy.h's bounds. On the fake driver the
// device functions are the host's C library; NVRTC still compiles every kernel for sm_90.
TEST_F(UserKernelTest, EveryMathFunctionIsWithinItsDocumentedBoundOnTheDevice) {
  Cuda(dir_.File("kernel-cache"));
  auto context = Context("tenant", kSm90);
  ASSERT_NE(context, nullptr);
  std::mt19937 rng(34);
  struct Pending {
    const testing::MathCase* c;
    std::vector<std::vector<HostTensor>> in;  // per dtype of kMathDTypes
    InFlight run;
  };
  std::vector<Pending> runs;
  // One kernel per function, over the four float dtypes at once (one compilation each).
  for (const testing::MathCase& c : testing::MathCases()) {
    auto definition = kernels::expr::ParseSource(testing::MathCaseSourceAllDTypes(c));
    ASSERT_TRUE(definition.ok()) << definition.status();
    auto kernel = kernels::expr::MakeUserKernel(*std::move(definition));
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    Pending p{&c, {}, {}};
    std::vector<HostTensor> all;
    std::vector<kernels::TensorMeta> metas;
    for (DType d : testing::kMathDTypes) {
      p.in.push_back(testing::MathCaseInputs(c, d, rng));
      for (const HostTensor& t : p.in.back()) {
        all.push_back(t);
        metas.push_back(t.meta);
      }
    }
    auto plan = kernels::PrepareKernel((*kernel)->def, metas, {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan->user = *kernel;
    p.run = Start(*context, *plan, all, static_cast<int>(runs.size() % 4));
    runs.push_back(std::move(p));
  }
  for (Pending& p : runs) {
    SCOPED_TRACE(p.c->name);
    ASSERT_TRUE(Finish(*context, p.run, absl::Seconds(600)).ok()) << *p.run.status;
    for (size_t k = 0; k < std::size(testing::kMathDTypes); ++k) {
      EXPECT_EQ(testing::CheckMathCase(*p.c, testing::kMathDTypes[k], p.in[k], p.run.got[k]), "");
    }
  }
  std::printf("device math: %zu functions over 4 float dtypes within their bounds\n", runs.size());
}

// ---- Compile limits and failures ------------------------------------------------------------

// A compile past its deadline fails its job (DEADLINE_EXCEEDED naming the limit), and only it:
// the tenant's other streams, another tenant's jobs and compilations go on meanwhile (one
// tenant's compilations never take every compile thread), and the stream runs the next job
// afterwards.
TEST_F(UserKernelTest, ACompilePastItsDeadlineFailsThatJobOnly) {
  setenv("TESSERA_KERNEL_COMPILE_TIMEOUT", "6", 1);
  Cuda("");
  auto slow = Context("slow", kSm90);
  auto other = Context("other", kSm90);
  ASSERT_NE(slow, nullptr);
  ASSERT_NE(other, nullptr);
  testing::UserCase hang = Swish("fake_compiler_hang");  // the fake's compiler sleeps on it
  const std::vector<HostTensor> x = Inputs(hang.plan);
  InFlight stuck = Start(*slow, hang.plan, x, /*stream=*/0);
  InFlight behind = Start(*slow, Swish("after_the_hang").plan, x, /*stream=*/0);
  InFlight stuck_too = Start(*slow, Swish("fake_compiler_hang_too").plan, x, /*stream=*/2);
  // Meanwhile: a catalog job on the tenant's other stream, another tenant's own kernel.
  auto neg = kernels::Registry::Global().Prepare("neg", {hang.plan.inputs[0]}, {});
  ASSERT_TRUE(neg.ok());
  InFlight catalog = Start(*slow, *neg, x, /*stream=*/1);
  InFlight theirs = Start(*other, Swish("theirs").plan, x, /*stream=*/0);
  ASSERT_TRUE(Finish(*slow, catalog).ok()) << *catalog.status;
  ASSERT_TRUE(Finish(*other, theirs).ok()) << *theirs.status;
  EXPECT_FALSE(stuck.done->HasBeenNotified()) << "other work waited for the slow compile";
  absl::Status s = Finish(*slow, stuck);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("the 6s limit on compiling a kernel"));
  EXPECT_THAT(s.message(), HasSubstr("fake_compiler_hang"));
  // The stream goes on with the job behind it.
  ASSERT_TRUE(Finish(*slow, behind).ok()) << *behind.status;
  EXPECT_EQ(testing::Compare(hang.plan, x, testing::Reference(hang.plan, x), behind.got), "");
  EXPECT_EQ(Finish(*slow, stuck_too).code(), absl::StatusCode::kDeadlineExceeded);
}

// A context closed while its job waits for a compilation answers the job CANCELLED at once.
TEST_F(UserKernelTest, AContextClosedWhileItsKernelCompilesCancelsTheJob) {
  setenv("TESSERA_KERNEL_COMPILE_TIMEOUT", "60", 1);
  Cuda("");
  auto context = Context("tenant", kSm90);
  ASSERT_NE(context, nullptr);
  testing::UserCase hang = Swish("fake_compiler_hang_forever");
  InFlight run = Start(*context, hang.plan, Inputs(hang.plan));
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  run.outputs.clear();
  context.reset();
  ASSERT_TRUE(run.done->WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(run.status->code(), absl::StatusCode::kCancelled) << *run.status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const absl::Time stop = absl::Now();
  backend_.reset();  // kills the compiler
  EXPECT_LT(absl::Now() - stop, absl::Seconds(5));
}

// What the compiler says becomes the job's status; the context stays usable.
TEST_F(UserKernelTest, CompilerFailuresFailTheJobWithTheirStatus) {
  struct Case {
    std::string script;  // the compiler (empty: a path that does not exist)
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", absl::StatusCode::kFailedPrecondition, "cannot be run (No such file or directory)"},
      {"echo 'cannot load NVRTC (libnvrtc.so.13): libnvrtc.so.13: cannot open shared object "
       "file' >&2; exit 2",
       absl::StatusCode::kFailedPrecondition, "need NVRTC (libnvrtc.so.13"},
      {"case \"$1\" in --version) echo 'nvrtc 0.0';; *) cat >/dev/null; echo 'error: "
       "expected a ;' >&2; exit 3;; esac",
       absl::StatusCode::kInternal, "NVRTC rejected the code generated in compiling kernel swish"},
      {"case \"$1\" in --version) echo 'nvrtc 0.0';; *) kill -SEGV $$;; esac",
       absl::StatusCode::kInternal, "died of SIGSEGV"},
      {"case \"$1\" in --version) echo 'nvrtc 0.0';; *) cat >/dev/null; echo 'out of memory' "
       ">&2; exit 5;; esac",
       absl::StatusCode::kResourceExhausted, "the 2048 MiB memory limit"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string compiler = dir_.File(absl::StrCat("compiler-", i));
    if (!cases[i].script.empty()) {
      std::ofstream(compiler) << "#!/bin/sh\n" << cases[i].script << "\n";
      chmod(compiler.c_str(), 0700);
    }
    setenv("TESSERA_KERNEL_COMPILER", compiler.c_str(), 1);
    Cuda("");
    {
      auto context = Context("tenant", kSm90);
      ASSERT_NE(context, nullptr);
      testing::UserCase swish = Swish();
      InFlight run = Start(*context, swish.plan, Inputs(swish.plan));
      absl::Status s = Finish(*context, run);
      EXPECT_EQ(s.code(), cases[i].code) << s;
      EXPECT_THAT(s.message(), HasSubstr(cases[i].says));
      if (cases[i].script.empty()) {
        EXPECT_THAT(s.message(), HasSubstr(compiler));
      }
      // The context is healthy: a catalog job runs.
      auto neg = kernels::Registry::Global().Prepare("neg", {swish.plan.inputs[0]}, {});
      ASSERT_TRUE(neg.ok());
      InFlight after = Start(*context, *neg, Inputs(swish.plan));
      EXPECT_TRUE(Finish(*context, after).ok()) << *after.status;
    }
    ExpectClean();
  }
}

// A job whose second step's kernel cannot be compiled runs its first step, then fails with the
// second's status, as a failed launch would.
TEST_F(UserKernelTest, AStepWhoseKernelCannotBeCompiledEndsItsJobAfterTheStepsBeforeIt) {
  const std::string compiler = dir_.File("rejecting-compiler");
  std::ofstream(compiler) << "#!/bin/sh\ncase \"$1\" in --version) echo 'nvrtc 0.0';; *) cat "
                             ">/dev/null; echo 'error: no' >&2; exit 3;; esac\n";
  chmod(compiler.c_str(), 0700);
  setenv("TESSERA_KERNEL_COMPILER", compiler.c_str(), 1);
  Cuda("");
  auto context = Context("tenant", kSm90);
  ASSERT_NE(context, nullptr);
  testing::UserCase swish = Swish();
  const std::vector<HostTensor> x = Inputs(swish.plan);
  auto neg = kernels::Registry::Global().Prepare("neg", {swish.plan.inputs[0]}, {});
  ASSERT_TRUE(neg.ok());
  auto xb = context->Allocate(x[0].bytes.size());
  auto a = context->Allocate(x[0].bytes.size());
  auto b = context->Allocate(x[0].bytes.size());
  ASSERT_TRUE(xb.ok() && a.ok() && b.ok());
  ASSERT_TRUE(context->CopyIn(**xb, 0, x[0].data(), x[0].bytes.size()).ok());
  std::vector<Step> steps;
  steps.push_back(Step{*neg, {*xb}, {*a}});
  steps.push_back(Step{swish.plan, {*a}, {*b}});
  absl::Notification done;
  ExecResult result;
  context->Enqueue(0, std::move(steps), [&](ExecResult r) {
    result = std::move(r);
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(result.status.code(), absl::StatusCode::kInternal) << result.status;
  EXPECT_EQ(result.failed_step, 1);
  HostTensor negated(DType::kF32, {3, 5});
  ASSERT_TRUE(context->CopyOut(**a, 0, negated.data(), negated.bytes.size()).ok());
  for (int64_t i = 0; i < negated.size(); ++i) {
    if (!std::isnan(x[0].Get(i))) {
      EXPECT_EQ(negated.Get(i), -x[0].Get(i)) << i;
    }
  }
}

// ---- The image cache --------------------------------------------------------------------------

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

int ModeOf(const std::string& path) {
  struct stat st {};
  stat(path.c_str(), &st);
  return static_cast<int>(st.st_mode & 07777);
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_F(UserKernelTest, CacheFilesAreOwnerOnlyKeyedByArchitectureAndServeARestart) {
  const std::string cache = dir_.File("kernel-cache");
  umask(0);  // the cache makes its own modes
  Cuda(cache);
  testing::UserCase swish = Swish();
  const std::vector<HostTensor> x = Inputs(swish.plan);
  for (int device : {kSm80, kSm90}) {
    auto context = Context("tenant", device);
    ASSERT_NE(context, nullptr);
    InFlight run = Start(*context, swish.plan, x);
    ASSERT_TRUE(Finish(*context, run).ok()) << *run.status;
  }
  umask(022);
  EXPECT_EQ(ModeOf(cache), 0700);
  const std::vector<std::string> files = Files(cache);
  ASSERT_EQ(files.size(), 2u) << ::testing::PrintToString(files);
  EXPECT_THAT(files[0], ::testing::StartsWith("sm_80-"));
  EXPECT_THAT(files[1], ::testing::StartsWith("sm_90-"));
  for (const std::string& f : files) EXPECT_EQ(ModeOf(cache + "/" + f), 0600) << f;
  EXPECT_THAT(Contents(cache + "/" + files[1]), HasSubstr("; sm_90; nvrtc "));
  ASSERT_EQ(Compilations().size(), 2u);

  // A restarted server finds both on disk: NVRTC does not run again.
  Cuda(cache);
  for (int device : {kSm80, kSm90}) {
    auto context = Context("tenant", device);
    ASSERT_NE(context, nullptr);
    InFlight run = Start(*context, swish.plan, x);
    ASSERT_TRUE(Finish(*context, run).ok()) << *run.status;
    EXPECT_EQ(testing::Compare(swish.plan, x, testing::Reference(swish.plan, x), run.got), "");
  }
  EXPECT_EQ(Compilations().size(), 2u);
  EXPECT_EQ(Files(cache), files);
}

TEST_F(UserKernelTest, ACorruptCacheFileIsRecompiledNeverLoaded) {
  const std::string cache = dir_.File("kernel-cache");
  testing::UserCase swish = Swish();
  const std::vector<HostTensor> x = Inputs(swish.plan);
  auto run_once = [&] {
    Cuda(cache);
    auto context = Context("tenant", kSm90);
    ASSERT_NE(context, nullptr);
    InFlight run = Start(*context, swish.plan, x);
    ASSERT_TRUE(Finish(*context, run).ok()) << *run.status;
    EXPECT_EQ(testing::Compare(swish.plan, x, testing::Reference(swish.plan, x), run.got), "");
  };
  run_once();
  ASSERT_EQ(Files(cache).size(), 1u);
  const std::string file = cache + "/" + Files(cache)[0];
  const std::string good = Contents(file);
  // Each damage in turn: the next start recompiles (one more NVRTC run) and rewrites the file.
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"a flipped image byte",
       good.substr(0, good.size() - 1) + static_cast<char>(good.back() ^ 1)},
      {"a truncated image", good.substr(0, good.size() - 10)},
      {"another key", std::string(good).replace(good.find("sm_90"), 5, "sm_80")},
      {"no header", good.substr(good.find("\n\n") + 2)},
      {"nothing", ""},
  };
  size_t compilations = Compilations().size();
  for (const auto& [what, bytes] : damages) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    run_once();
    EXPECT_EQ(Compilations().size(), ++compilations) << what << " was not recompiled";
    EXPECT_EQ(Contents(file), good) << what << " was not replaced";
    EXPECT_EQ(ModeOf(file), 0600);
  }
}

}  // namespace
}  // namespace tessera
