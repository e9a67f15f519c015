// The code generator of tenant-defined kernels (kernels/expr/cuda_codegen.h) and the production
// kernel compiler (tessera-kernel-compiler, server/backend/cuda/kernel_compiler_main.cc) on a
// few hand-written programs: what the generated source is, what is refused, and that the real
// NVRTC compiles it to a cubin for sm_80 and sm_90 (PTX for a GPU newer than NVRTC).
#include "kernels/expr/cuda_codegen.h"

#include <bit>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/cuda/nvrtc_library.h"
#include "tests/fake_cuda/user_kernel_corpus.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using kernels::DType;
using kernels::expr::BinaryOp;
using kernels::expr::Combine;
using kernels::expr::Func;
using kernels::expr::GenerateCudaKernel;
using kernels::expr::MakeCudaLaunch;
using kernels::expr::Program;
using kernels::expr::Type;
using ::testing::HasSubstr;
using ::testing::Not;

// out = gelu(x * w + b) * alpha, q = k / -7 (wrapping, total): f16, f32, bf16 and i32 inputs.
Program Fused() {
  testing::ProgramBuilder b("fused");
  b.AddInput("x", DType::kF16);
  b.AddInput("w", DType::kF32);
  b.AddInput("b", DType::kBF16);
  b.AddInput("k", DType::kI32);
  b.AddOutput("y", DType::kF16);
  b.AddOutput("q", DType::kI64);
  b.AddParam("alpha", kernels::expr::ScalarKind::kFloat, 1.0);
  const int32_t affine =
      b.Binary(BinaryOp::kAdd, b.Binary(BinaryOp::kMul, b.Input(0), b.Input(1)), b.Input(2));
  b.Result(b.Binary(BinaryOp::kMul, b.Call(Func::kGelu, affine), b.Param(0, Type::kF32)));
  b.Result(b.Binary(BinaryOp::kDiv, b.Input(3), b.ConstInt(-7)));
  return b.Build();
}

// argmax over x * x, and a mean.
Program Argmax() {
  testing::ProgramBuilder b("argmax_sq");
  b.AddInput("x", DType::kF32);
  b.AddOutput("i", DType::kI64);
  const int32_t x = b.Input(0);
  b.Reduce(Combine::kArgmax, b.Binary(BinaryOp::kMul, x, x));
  b.Result(b.Reduced());
  return b.Build();
}

Program Mean() {
  testing::ProgramBuilder b("mean");
  b.AddInput("x", DType::kF64);
  b.AddOutput("m", DType::kBF16);
  b.Reduce(Combine::kSum, b.Input(0));
  b.Result(b.Binary(BinaryOp::kDiv, b.Reduced(), b.Cast(b.Count(), Type::kF64)));
  return b.Build();
}

TEST(CudaCodegenTest, TheSourceIsSelfContainedDeterministicAndNamedByTheHash) {
  for (const Program& p : {Fused(), Argmax(), Mean()}) {
    auto a = GenerateCudaKernel(p);
    auto b = GenerateCudaKernel(p);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(a->source, b->source);
    EXPECT_EQ(a->entry, "tessera_user_" + p.hash);
    EXPECT_EQ(a->reduction, p.reduction.has_value());
    EXPECT_THAT(a->source, HasSubstr(absl::StrCat("extern \"C\" __global__ void __launch_bounds__(",
                                                  a->reduction ? 1024 : 256, ") ", a->entry,
                                                  "(const TkParams p)")));
    EXPECT_THAT(a->source, Not(HasSubstr("#include")));
  }
}

TEST(CudaCodegenTest, AProgramTheCheckerWouldNotProduceIsInternal) {
  auto expect_internal = [](Program p, const std::string& says) {
    auto k = GenerateCudaKernel(p);
    ASSERT_FALSE(k.ok());
    EXPECT_EQ(k.status().code(), absl::StatusCode::kInternal) << k.status();
    EXPECT_THAT(k.status().message(), HasSubstr(says));
  };
  // The first node of a kind.
  auto first = [](const Program& program, kernels::expr::NodeKind kind) {
    for (size_t i = 0; i < program.nodes.size(); ++i) {
      if (program.nodes[i].kind == kind) return i;
    }
    return program.nodes.size();
  };
  using kernels::expr::NodeKind;
  Program p = Fused();
  p.nodes[first(p, NodeKind::kBinary)].args = {static_cast<int32_t>(p.nodes.size()) - 1, 0};
  expect_internal(p, "does not precede it");
  p = Fused();
  p.nodes[first(p, NodeKind::kInput)].index = 9;
  expect_internal(p, "reads input 9 of 4");
  p = Fused();
  p.hash = "not hex";
  expect_internal(p, "is not lowercase hex");
  p = Fused();
  p.results.pop_back();
  expect_internal(p, "1 results for 2 outputs");
  p = Fused();
  p.nodes[first(p, NodeKind::kBinary)].type = Type::kF64;  // x * w in f64, f32 operands
  expect_internal(p, "arithmetic with operands of other types");
  p = Fused();
  p.nodes[first(p, NodeKind::kCall)].op = static_cast<uint8_t>(Func::kIsnan);  // typed f32
  expect_internal(p, "a predicate with operands of other types");
  p = Fused();
  p.nodes[first(p, NodeKind::kCall)].op = static_cast<uint8_t>(kernels::expr::kLastFunc) + 1;
  expect_internal(p, "calls function");
  p = Fused();
  p.nodes[first(p, NodeKind::kBinary)].op = static_cast<uint8_t>(BinaryOp::kShl);  // on f32
  expect_internal(p, "a bit operation with operands of other types");
  p = Argmax();
  p.reduction->accumulate = Type::kF32;
  expect_internal(p, "accumulating in float");
}

TEST(CudaCodegenTest, TheLaunchCoversTheBroadcastShapeAndSkipsEmptyOnes) {
  auto kernel = testing::UserKernelOf(Fused());
  kernels::Plan plan =
      testing::UserPlan(kernel, {{3, 1, 5}, {5}, {4, 1}, {1, 1, 1}}, {{"alpha", 2.0}});
  ASSERT_EQ(plan.outputs[0].shape, (kernels::Shape{3, 4, 5}));
  auto launch = MakeCudaLaunch(kernel->program, plan, {16, 32, 48, 64}, {80, 96}, 132);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->block, 256u);
  EXPECT_EQ(launch->grid, 1u);  // 60 elements
  // in[4], out[2], param[1]: the addresses, then alpha's bits, then n.
  EXPECT_EQ(launch->params[0], 16);
  EXPECT_EQ(launch->params[4], 80);
  EXPECT_EQ(launch->params[6], std::bit_cast<int64_t>(2.0));
  EXPECT_EQ(launch->params[7], 60);
  plan = testing::UserPlan(kernel, {{3, 0, 5}, {5}, {1, 1}, {1}});
  launch = MakeCudaLaunch(kernel->program, plan, {16, 32, 48, 64}, {80, 96}, 132);
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ(launch->grid, 0u);
  // A plan of other dtypes is refused.
  plan.inputs[0].dtype = DType::kF32;
  EXPECT_EQ(MakeCudaLaunch(kernel->program, plan, {16, 32, 48, 64}, {80, 96}, 132).status().code(),
            absl::StatusCode::kInternal);
}

// ---- tessera-kernel-compiler ----------------------------------------------------------------

struct Compiled {
  int status = -1;
  std::string out, err;
};

Compiled RunCompiler(const std::string& args, const std::string& source) {
  testing::TempDir dir;
  std::ofstream(dir.File("in.cu")) << source;
  const std::string command =
      absl::StrCat(TESSERA_KERNEL_COMPILER_BIN, " ", args, " < ", dir.File("in.cu"), " > ",
                   dir.File("out"), " 2> ", dir.File("err"));
  Compiled c;
  const int raw = std::system(command.c_str());
  c.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ostringstream out, err;
  out << std::ifstream(dir.File("out"), std::ios::binary).rdbuf();
  err << std::ifstream(dir.File("err")).rdbuf();
  c.out = out.str();
  c.err = err.str();
  return c;
}

TEST(KernelCompilerTest, NvrtcCompilesGeneratedKernelsToCubinsForSm80AndSm90) {
  Compiled version = RunCompiler("--version", "");
  ASSERT_EQ(version.status, 0) << version.err;
  EXPECT_THAT(version.out, ::testing::StartsWith("nvrtc "));
  int compiled = 0;
  for (const Program& p : {Fused(), Argmax(), Mean()}) {
    auto k = GenerateCudaKernel(p);
    ASSERT_TRUE(k.ok());
    for (const char* arch : {"sm_80", "sm_90"}) {
      Compiled c = RunCompiler(
          absl::StrCat("--gpu-architecture=", arch, " --name=", p.definition.name), k->source);
      ASSERT_EQ(c.status, cuda::kCompilerOk) << p.definition.name << " " << arch << ": " << c.err;
      ASSERT_GT(c.out.size(), 4u);
      EXPECT_EQ(c.out.substr(0, 4),
                "\x7f"
                "ELF")
          << "a cubin";
      EXPECT_NE(c.out.find(k->entry), std::string::npos) << "the entry point's symbol";
      ++compiled;
    }
  }
  EXPECT_EQ(compiled, 6);
  // A GPU newer than this NVRTC gets PTX (NUL-terminated) for the newest architecture it has.
  auto k = GenerateCudaKernel(Fused());
  Compiled ptx = RunCompiler("--gpu-architecture=sm_999", k->source);
  ASSERT_EQ(ptx.status, cuda::kCompilerOk) << ptx.err;
  EXPECT_THAT(ptx.out, HasSubstr(".target sm_"));
  EXPECT_EQ(ptx.out.back(), '\0');
}

// A program at the node limit (kernels/expr/ast.h: kMaxNodes), of the most expensive
// operations, compiles. How long it takes is printed, not asserted (timings belong to
// benchmarks; on an idle 2-core machine about 5 s against the module's 30 s limit, nvrtc.h).
TEST(KernelCompilerTest, ProgramsAtTheNodeLimitCompile) {
  for (bool reduction : {false, true}) {
    testing::ProgramBuilder b(reduction ? "largest_reduction" : "largest");
    b.AddInput("x", DType::kF32);
    b.AddInput("k", DType::kI64);
    b.AddOutput("y", reduction ? DType::kF64 : DType::kBF16);
    const int32_t x = b.Input(0);
    const int32_t k = b.Input(1);
    int32_t v = x, n = k;
    static constexpr Func kFuncs[] = {Func::kGelu, Func::kSigmoid, Func::kTanh,
                                      Func::kExp,  Func::kLog,     Func::kPow};
    for (int i = 0; i < 145; ++i) {  // 7 nodes each
      const Func f = kFuncs[i % 6];
      v = f == Func::kPow ? b.Call(f, v, x) : b.Call(f, v);
      n = b.Binary(BinaryOp::kDiv, n, b.Binary(BinaryOp::kMod, k, b.ConstInt(i + 2)));
      v = b.Where(b.Binary(BinaryOp::kGt, v, x), v, b.Cast(n, Type::kF32));
    }
    if (reduction) {
      b.Reduce(Combine::kSum, b.Cast(v, Type::kF64));
      b.Result(b.Reduced());
    } else {
      b.Result(v);
    }
    const Program p = b.Build();
    ASSERT_LE(p.nodes.size(), kernels::expr::kMaxNodes);
    ASSERT_GE(p.nodes.size(), kernels::expr::kMaxNodes - 32);
    auto k2 = GenerateCudaKernel(p);
    ASSERT_TRUE(k2.ok()) << k2.status();
    const absl::Time start = absl::Now();
    Compiled c = RunCompiler("--gpu-architecture=sm_90", k2->source);
    const absl::Duration took = absl::Now() - start;
    ASSERT_EQ(c.status, cuda::kCompilerOk) << c.err;
    std::printf("%zu nodes (%s): %zu bytes of source compiled in %s\n", p.nodes.size(),
                reduction ? "reduction" : "element-wise", k2->source.size(),
                absl::FormatDuration(took).c_str());
  }
}

TEST(KernelCompilerTest, ItsRefusalsSayWhy) {
  auto k = GenerateCudaKernel(Fused());
  Compiled old = RunCompiler("--gpu-architecture=sm_60", k->source);
  EXPECT_EQ(old.status, cuda::kCompilerUnsupportedArch);
  EXPECT_THAT(old.err, HasSubstr("cannot compile for sm_60"));
  Compiled bad = RunCompiler("--gpu-architecture=sm_90", "this is not CUDA");
  EXPECT_EQ(bad.status, cuda::kCompilerRejected);
  EXPECT_THAT(bad.err, HasSubstr("error"));
  EXPECT_EQ(RunCompiler("--gpu-architecture=90", "").status, cuda::kCompilerUsage);
  EXPECT_EQ(RunCompiler("", "").status, cuda::kCompilerUsage);
}

}  // namespace
}  // namespace tessera
