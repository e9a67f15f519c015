// GPU benchmarks (run on demand on a machine with a GPU; not part of ctest):
//   matmul through the CUDA backend vs cuBLAS called directly (target >= 0.95x),
//   element-wise bandwidth vs a plain device-to-device copy at >= 64 MiB (target >= 0.85x),
//   per-tenant context creation time and device memory per context kind.
// Both sides of each ratio run in this process, interleaved call by call, and in the same
// driver context: the baseline runs in the tenant's own context (MPS client, green or plain,
// found through the module's kCudaModuleContextHandle), so no ratio is flattered or hurt by
// switching between contexts. Each call waits for its result (the backend's completion
// callback; cudaStreamSynchronize directly). Job overhead: a tiny job through the backend
// against the same-sized device copy and a synchronize, with each completion mode; a 10-step
// program with and without CUDA graphs; single launches (an add, a matmul) as kernel launches
// and as CUDA graphs (--cuda_single_launch_graphs).
//   tessera_gpu_bench [--quick]     prints a Markdown report
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

#include "kernels/registry.h"
#include "server/backend/cuda_module.h"
#include "server/backend/select.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
using kernels::DType;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#define CHECK_CUDA(expr)                                              \
  do {                                                                \
    cudaError_t e = (expr);                                           \
    if (e != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e)); \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)

double RunJob(TenantContext& context, std::vector<Step> steps) {
  absl::Notification done;
  absl::Status status;
  auto start = Clock::now();
  context.Enqueue(0, std::move(steps), [&](ExecResult r) {
    status = r.status;
    done.Notify();
  });
  done.WaitForNotification();
  double s = Seconds(start, Clock::now());
  if (!status.ok()) {
    std::fprintf(stderr, "job failed: %s\n", status.ToString().c_str());
    std::exit(1);
  }
  return s;
}

// The loaded CUDA module's context hook (SelectBackend loads the module RTLD_LOCAL; it is
// found among the loaded objects by name and reopened).
CudaContextHandle ContextHandleHook() {
  static CudaContextHandle hook = [] {
    std::string path;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          const std::string name = info->dlpi_name == nullptr ? "" : info->dlpi_name;
          if (absl::EndsWith(name, "/libtessera_cuda.so")) {
            *static_cast<std::string*>(out) = name;
            return 1;
          }
          return 0;
        },
        &path);
    void* module = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    auto found = module == nullptr
                     ? nullptr
                     : reinterpret_cast<CudaContextHandle>(dlsym(module, kCudaModuleContextHandle));
    if (found == nullptr) {
      std::fprintf(stderr, "the CUDA module's %s was not found\n", kCudaModuleContextHandle);
      std::exit(1);
    }
    return found;
  }();
  return hook;
}

// Makes the tenant context current on this thread: the runtime API (cudaMalloc, streams,
// cuBLAS) then works in it.
void EnterContextOf(TenantContext& context) {
  auto raw = static_cast<CUcontext>(ContextHandleHook()(context));
  if (raw == nullptr || cuCtxSetCurrent(raw) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cannot enter the tenant's context\n");
    std::exit(1);
  }
}

// A second CUDA backend with other options, for a comparison within one run (exits on error).
std::unique_ptr<Backend> CudaBackendOrExit(const BackendOptions& options) {
  auto choice = SelectBackend(options);
  if (!choice.ok()) {
    std::fprintf(stderr, "backend: %s\n", choice.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(choice->backend);
}

std::unique_ptr<TenantContext> NewContext(Backend& backend, const std::string& id, uint32_t share) {
  Quota quota{.device_memory_bytes = 8ull << 30,
              .compute_share_percent = share,
              .max_streams = 1,
              .max_queued_jobs = 64,
              .priority = Priority::kNormal};
  auto context = backend.CreateContext({id, quota, 0});
  if (!context.ok()) {
    std::fprintf(stderr, "context: %s\n", context.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(context);
}

void Matmul(Backend& backend, int reps, std::string& md) {
  md +=
      "\n### matmul (f32 and f16, square, output in place) vs cuBLAS called directly\n\n"
      "| dtype | n | Tessera ms (median) | cuBLAS ms (median) | ratio (cuBLAS time / Tessera "
      "time) | target |\n|---|---|---|---|---|---|\n";
  auto context = NewContext(backend, "matmul", 100);
  EnterContextOf(*context);
  cublasHandle_t handle;
  cublasCreate(&handle);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasSetStream(handle, stream);
  for (DType dtype : {DType::kF32, DType::kF16}) {
    for (int64_t n : {1024, 2048, 4096, 8192}) {
      const size_t bytes = static_cast<size_t>(n * n) * kernels::DTypeSize(dtype);
      auto plan =
          kernels::Registry::Global().Prepare("matmul", {{dtype, {n, n}}, {dtype, {n, n}}}, {});
      auto a = *context->Allocate(bytes);
      auto b = *context->Allocate(bytes);
      auto y = *context->Allocate(bytes);
      void *da, *db, *dy;
      CHECK_CUDA(cudaMalloc(&da, bytes));
      CHECK_CUDA(cudaMalloc(&db, bytes));
      CHECK_CUDA(cudaMalloc(&dy, bytes));
      CHECK_CUDA(cudaMemset(da, 0, bytes));
      CHECK_CUDA(cudaMemset(db, 0, bytes));
      const float one = 1, zero = 0;
      auto direct = [&] {
        auto start = Clock::now();
        cudaDataType t = dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16F;
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(n),
                     static_cast<int>(n), &one, db, t, static_cast<int>(n), da, t,
                     static_cast<int>(n), &zero, dy, t, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        return Seconds(start, Clock::now());
      };
      std::vector<double> ours, theirs;
      RunJob(*context, {Step{*plan, {a, b}, {y}}});  // warm-up: handle, kernels
      direct();
      for (int i = 0; i < reps; ++i) {
        ours.push_back(RunJob(*context, {Step{*plan, {a, b}, {y}}}));
        theirs.push_back(direct());
      }
      const double o = Median(ours), t = Median(theirs);
      absl::StrAppend(&md, "| ", kernels::DTypeName(dtype), " | ", n, " | ", o * 1e3, " | ",
                      t * 1e3, " | ", t / o, " | ", n >= 2048 ? ">= 0.95" : "reported", " |\n");
      cudaFree(da);
      cudaFree(db);
      cudaFree(dy);
    }
  }
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
}

void Elementwise(Backend& backend, int reps, std::string& md) {
  md +=
      "\n### element-wise bandwidth (f32) vs a device-to-device copy\n\n"
      "Bandwidth counts bytes read plus written: add moves 3 x size, scale 2 x size, the "
      "copy 2 x size.\n\n| kernel | size | Tessera GB/s | copy GB/s | ratio | target |\n"
      "|---|---|---|---|---|---|\n";
  auto context = NewContext(backend, "elementwise", 100);
  EnterContextOf(*context);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int64_t mib : {64, 256, 1024}) {
    const int64_t n = mib * (1 << 20) / 4;
    const size_t bytes = static_cast<size_t>(n) * 4;
    auto a = *context->Allocate(bytes);
    auto b = *context->Allocate(bytes);
    auto y = *context->Allocate(bytes);
    void *src, *dst;
    CHECK_CUDA(cudaMalloc(&src, bytes));
    CHECK_CUDA(cudaMalloc(&dst, bytes));
    auto copy = [&] {
      auto start = Clock::now();
      CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      return Seconds(start, Clock::now());
    };
    const kernels::Registry& reg = kernels::Registry::Global();
    auto add = *reg.Prepare("add", {{DType::kF32, {n}}, {DType::kF32, {n}}}, {});
    auto scale = *reg.Prepare("scale", {{DType::kF32, {n}}}, {{"alpha", 2.0}});
    struct Kernel {
      const char* name;
      Step step;
      double moved;
    } kernels_under_test[] = {{"add", Step{add, {a, b}, {y}}, 3.0},
                              {"scale", Step{scale, {a}, {y}}, 2.0}};
    for (auto& k : kernels_under_test) {
      std::vector<double> ours, theirs;
      RunJob(*context, {k.step});
      copy();
      for (int i = 0; i < reps; ++i) {
        ours.push_back(RunJob(*context, {k.step}));
        theirs.push_back(copy());
      }
      const double ours_bw = k.moved * static_cast<double>(bytes) / Median(ours) / 1e9;
      const double copy_bw = 2.0 * static_cast<double>(bytes) / Median(theirs) / 1e9;
      absl::StrAppend(&md, "| ", k.name, " | ", mib, " MiB | ", ours_bw, " | ", copy_bw, " | ",
                      ours_bw / copy_bw, " | >= 0.85 |\n");
    }
    cudaFree(src);
    cudaFree(dst);
  }
  cudaStreamDestroy(stream);
}

// A job's fixed cost: a 1 KiB add through the backend (enqueue, launch, completion, callback)
// against a 1 KiB device-to-device copy and a stream synchronize in the same context, p50 of
// each, with each way the completion thread can learn that jobs ended.
void Overhead(int reps, std::string& md) {
  md +=
      "\n### job overhead: a 1 KiB add through the backend vs a 1 KiB device copy and a "
      "synchronize (same context)\n\n"
      "| completion | Tessera p50 us | direct p50 us | overhead us | target |\n"
      "|---|---|---|---|---|\n";
  for (const char* completion : {"spin", "host_function"}) {
    auto backend =
        CudaBackendOrExit({.backend = "cuda", .mps = "auto", .cuda_completion = completion});
    {
      auto context = NewContext(*backend, absl::StrCat("overhead-", completion), 100);
      EnterContextOf(*context);
      cudaStream_t stream;
      CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      void *src, *dst;
      CHECK_CUDA(cudaMalloc(&src, 1024));
      CHECK_CUDA(cudaMalloc(&dst, 1024));
      auto a = *context->Allocate(1024), y = *context->Allocate(1024);
      auto add = *kernels::Registry::Global().Prepare(
          "add", {{DType::kF32, {256}}, {DType::kF32, {256}}}, {});
      auto direct = [&] {
        auto start = Clock::now();
        CHECK_CUDA(cudaMemcpyAsync(dst, src, 1024, cudaMemcpyDeviceToDevice, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        return Seconds(start, Clock::now());
      };
      std::vector<double> ours, theirs;
      for (int i = 0; i < 20; ++i) {  // warm-up
        RunJob(*context, {Step{add, {a, a}, {y}}});
        direct();
      }
      for (int i = 0; i < reps * 50; ++i) {
        ours.push_back(RunJob(*context, {Step{add, {a, a}, {y}}}));
        theirs.push_back(direct());
      }
      const double o = Median(ours) * 1e6, t = Median(theirs) * 1e6;
      absl::StrAppend(&md, "| ", completion, " | ", o, " | ", t, " | ", o - t, " | <= 10 |\n");
      cudaFree(src);
      cudaFree(dst);
      cudaStreamDestroy(stream);
    }
    cuCtxSetCurrent(nullptr);
  }
}

// A program of 10 small steps (1 KiB adds) through the backend, with and without CUDA graphs
// (--cuda_graphs), p50: whether one graph launch beats ten kernel launches on this device.
void Programs(int reps, std::string& md) {
  md +=
      "\n### a 10-step program of 1 KiB adds, as a CUDA graph and step by step\n\n"
      "| graphs | Tessera p50 us |\n|---|---|\n";
  for (bool graphs : {true, false}) {
    auto backend = CudaBackendOrExit({.backend = "cuda", .mps = "auto", .cuda_graphs = graphs});
    auto context = NewContext(*backend, graphs ? "graphs" : "steps", 100);
    auto a = *context->Allocate(1024), y = *context->Allocate(1024);
    auto add = *kernels::Registry::Global().Prepare(
        "add", {{DType::kF32, {256}}, {DType::kF32, {256}}}, {});
    const std::vector<Step> program(10, Step{add, {a, a}, {y}});
    for (int i = 0; i < 20; ++i) RunJob(*context, program);  // warm-up; captured on the 2nd
    std::vector<double> times;
    for (int i = 0; i < reps * 50; ++i) times.push_back(RunJob(*context, program));
    absl::StrAppend(&md, "| ", graphs ? "on" : "off", " | ", Median(times) * 1e6, " |\n");
  }
}

// Single launches through the backend as kernel launches (the default) and as CUDA graphs
// (--cuda_single_launch_graphs), p50: whether a one-node graph launch beats the launch it
// replaces, for an element-wise kernel and a cuBLAS matmul (several kernels inside cuBLAS).
void SingleLaunches(int reps, std::string& md) {
  md +=
      "\n### single launches as kernel launches and as CUDA graphs "
      "(--cuda_single_launch_graphs)\n\n"
      "| launch | kernel launches p50 us | graph p50 us | graph / launches |\n|---|---|---|---|\n";
  struct Case {
    const char* name;
    const char* kernel;
    DType dtype;
    int64_t n;  // elements of an add; a matmul's n x n
  };
  const std::vector<Case> cases = {{"add f32 1 KiB", "add", DType::kF32, 256},
                                   {"add f32 64 MiB", "add", DType::kF32, int64_t{16} << 20},
                                   {"matmul f16 n=256", "matmul", DType::kF16, 256},
                                   {"matmul f16 n=1024", "matmul", DType::kF16, 1024}};
  std::vector<std::array<double, 2>> p50(cases.size());
  for (bool graphs : {false, true}) {
    auto backend =
        CudaBackendOrExit({.backend = "cuda", .mps = "auto", .cuda_single_launch_graphs = graphs});
    auto context = NewContext(*backend, graphs ? "single-graphs" : "single-launches", 100);
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      const bool matmul = std::string_view(k.kernel) == "matmul";
      const std::vector<int64_t> shape =
          matmul ? std::vector<int64_t>{k.n, k.n} : std::vector<int64_t>{k.n};
      const size_t bytes =
          static_cast<size_t>(matmul ? k.n * k.n : k.n) * kernels::DTypeSize(k.dtype);
      auto plan =
          *kernels::Registry::Global().Prepare(k.kernel, {{k.dtype, shape}, {k.dtype, shape}}, {});
      auto a = *context->Allocate(bytes), y = *context->Allocate(bytes);
      const std::vector<Step> launch = {Step{plan, {a, a}, {y}}};
      for (int i = 0; i < 10; ++i) RunJob(*context, launch);  // loaded; captured at the 2nd
      std::vector<double> times;
      for (int i = 0; i < reps * 20; ++i) times.push_back(RunJob(*context, launch));
      p50[c][graphs ? 1 : 0] = Median(times) * 1e6;
    }
  }
  for (size_t c = 0; c < cases.size(); ++c) {
    absl::StrAppend(&md, "| ", cases[c].name, " | ", p50[c][0], " | ", p50[c][1], " | ",
                    p50[c][1] / p50[c][0], " |\n");
  }
}

void Contexts(Backend& backend, std::string& md) {
  md +=
      "\n### per-tenant context creation\n\n"
      "| share | kind | create ms (median of 8) | device memory per context (MiB) |\n"
      "|---|---|---|---|\n";
  for (uint32_t share : {25u, 100u}) {
    std::vector<std::unique_ptr<TenantContext>> contexts;
    std::vector<double> times;
    size_t free_before = 0, free_after = 0, total = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
    for (int i = 0; i < 8; ++i) {
      auto start = Clock::now();
      contexts.push_back(NewContext(backend, absl::StrCat("ctx-", share, "-", i), share));
      times.push_back(Seconds(start, Clock::now()));
    }
    CHECK_CUDA(cudaMemGetInfo(&free_after, &total));
    const double per = static_cast<double>(free_before - free_after) / 8 / (1 << 20);
    absl::StrAppend(&md, "| ", share, "% | ", ContextKindName(contexts[0]->info().kind), " | ",
                    Median(times) * 1e3, " | ", per, " |\n\n",
                    "reason: ", contexts[0]->info().reason, "\n\n");
  }
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  auto choice = tessera::SelectBackend({.backend = "cuda", .mps = "auto"});
  if (!choice.ok()) {
    std::printf("GPU benchmarks skipped: %s\n", choice.status().ToString().c_str());
    return 0;
  }
  CHECK_CUDA(cudaFree(nullptr));  // the direct baselines' context
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::string md = absl::StrCat("## GPU benchmarks: ", prop.name, ", ", prop.multiProcessorCount,
                                " SMs; MPS: ", choice->backend->mps().reason, "\n");
  tessera::Contexts(*choice->backend, md);
  tessera::Matmul(*choice->backend, quick ? 5 : 21, md);
  tessera::Elementwise(*choice->backend, quick ? 5 : 21, md);
  cuCtxSetCurrent(nullptr);
  tessera::Overhead(quick ? 5 : 21, md);
  tessera::Programs(quick ? 5 : 21, md);
  tessera::SingleLaunches(quick ? 5 : 21, md);
  std::printf("%s", md.c_str());
  return 0;
}
