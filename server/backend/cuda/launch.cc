#include "server/backend/cuda/launch.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"

#include "kernels/cuda/params.h"
#include "kernels/expr/cuda_codegen.h"
#include "kernels/expr/user_kernel.h"
#include "kernels/geometry.h"
#include "server/backend/cuda/ops.h"
#include "server/backend/cuda/resources.h"

// The fatbins nvcc built from kernels/cuda/*.cu, embedded by fatbins.S.
extern "C" {
extern const unsigned char tessera_fatbin_elementwise[];
extern const unsigned char tessera_fatbin_reduce[];
}

namespace tessera::cuda {
namespace {

using kernels::DType;
using kernels::Plan;
namespace tc = ::tessera_cuda;

constexpr int kBlock = kElementwiseBlock;

// Blocks for a grid-stride loop over `n` elements: enough to fill every SM several times.
unsigned int GridFor(int64_t n, int sms, int block = kBlock) {
  int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned int>(std::clamp<int64_t>(blocks, 1, int64_t{sms} * 16));
}

// One block per row (grid-stride over rows), up to kMaxRowBlock threads for long rows; one warp for
// an empty row (a reduction over an empty axis still writes its identity).
unsigned int RowBlock(int64_t length) {
  int64_t threads = std::clamp<int64_t>((length + 31) / 32 * 32, 32, kMaxRowBlock);
  return static_cast<unsigned int>(
      std::min<int64_t>(threads, 256 * std::max<int64_t>(1, (length + 4095) / 4096)));
}

class Launcher {
 public:
  Launcher(const LaunchTarget& target) : t_(target) {}  // NOLINT: local helper

  template <typename... Args>
  absl::Status Launch(const std::string& name, unsigned int grid, unsigned int block,
                      Args... args) {
    absl::StatusOr<CUkernel> kernel = t_.kernels->Find(name);
    if (!kernel.ok()) return kernel.status();
    std::array<void*, sizeof...(Args)> params{static_cast<void*>(&args)...};
    return t_.driver->Check(
        t_.driver->cuLaunchKernel(reinterpret_cast<CUfunction>(*kernel), grid, 1, 1, block, 1, 1, 0,
                                  t_.stream, params.data(), nullptr),
        absl::StrCat("launching ", name));
  }

 private:
  const LaunchTarget& t_;
};

absl::Status Unary(Launcher& l, const LaunchTarget& t, int op, const Plan& p, CUdeviceptr x,
                   CUdeviceptr y, double alpha = 1, double beta = 0) {
  const int64_t n = kernels::CheckedNumElements(p.outputs[0].shape);
  if (n == 0) return absl::OkStatus();
  return l.Launch(EntryPointOf(CudaLauncher::kUnary, p.outputs[0].dtype), GridFor(n, t.sms), kBlock,
                  op, n, x, y, alpha, beta);
}

absl::Status Binary(Launcher& l, const LaunchTarget& t, int op, const Plan& p,
                    const std::vector<CUdeviceptr>& in, CUdeviceptr y) {
  const int64_t n = kernels::CheckedNumElements(p.outputs[0].shape);
  if (n == 0) return absl::OkStatus();
  kernels::BroadcastGeometry g =
      kernels::MakeBroadcast(p.outputs[0].shape, {p.inputs[0].shape, p.inputs[1].shape});
  tc::BinaryParams params{};
  params.n = n;
  params.rank = static_cast<int>(g.shape.size());
  params.contiguous = g.shape.size() == 1 && g.strides[0][0] == 1 && g.strides[1][0] == 1;
  for (size_t d = 0; d < g.shape.size(); ++d) {
    params.shape[d] = g.shape[d];
    params.stride_a[d] = g.strides[0][d];
    params.stride_b[d] = g.strides[1][d];
  }
  return l.Launch(EntryPointOf(CudaLauncher::kBinary, p.outputs[0].dtype), GridFor(n, t.sms),
                  kBlock, op, params, in[0], in[1], y);
}

absl::Status Reduce(Launcher& l, const LaunchTarget& t, int op, const Plan& p, CUdeviceptr x,
                    CUdeviceptr y) {
  kernels::ReduceGeometry g = kernels::MakeReduceGeometry(p.inputs[0].shape, ReducedDims(p));
  tc::ReduceParams params{};
  params.outputs = kernels::CheckedNumElements(p.outputs[0].shape);
  if (params.outputs == 0) return absl::OkStatus();
  params.count = kernels::CheckedNumElements(p.inputs[0].shape) == 0 ? 0 : g.reduced_count;
  params.kept_rank = static_cast<int>(g.kept_shape.size());
  params.reduced_rank = static_cast<int>(g.reduced_shape.size());
  std::copy(g.kept_shape.begin(), g.kept_shape.end(), params.kept_shape);
  std::copy(g.kept_strides.begin(), g.kept_strides.end(), params.kept_strides);
  std::copy(g.reduced_shape.begin(), g.reduced_shape.end(), params.reduced_shape);
  std::copy(g.reduced_strides.begin(), g.reduced_strides.end(), params.reduced_strides);
  const unsigned int grid =
      static_cast<unsigned int>(std::min<int64_t>(params.outputs, int64_t{t.sms} * 32));
  return l.Launch(EntryPointOf(CudaLauncher::kReduce, p.inputs[0].dtype), grid,
                  RowBlock(params.count), op, params, x, y);
}

tc::AxisParams AxisParamsOf(const Plan& p) {
  const kernels::Shape& shape = p.inputs[0].shape;
  kernels::AxisGeometry g =
      shape.empty() ? kernels::AxisGeometry{} : kernels::AroundAxis(shape, kernels::AxisOf(p));
  return tc::AxisParams{g.outer, g.length, g.inner};
}

absl::Status Rows(Launcher& l, const LaunchTarget& t, const std::string& name,
                  const tc::AxisParams& a, auto... args) {
  const int64_t rows = a.outer * a.inner;
  if (rows == 0 || a.length == 0) return absl::OkStatus();
  const unsigned int grid = static_cast<unsigned int>(std::min<int64_t>(rows, int64_t{t.sms} * 32));
  return l.Launch(name, grid, RowBlock(a.length), args...);
}

absl::Status Transpose(Launcher& l, const LaunchTarget& t, const Plan& p, CUdeviceptr x,
                       CUdeviceptr y) {
  const kernels::Shape& in = p.inputs[0].shape;
  const int64_t n = kernels::CheckedNumElements(in);
  if (n == 0) return absl::OkStatus();
  const size_t rank = in.size();
  std::vector<int64_t> perm;
  if (kernels::HasAttr(p.attrs, "perm")) {
    perm = kernels::AttrInts(p.attrs, "perm");
  } else {
    for (size_t d = rank; d-- > 0;) perm.push_back(static_cast<int64_t>(d));
  }
  std::vector<int64_t> strides = kernels::ContiguousStrides(in);
  tc::PermuteParams params{};
  params.n = n;
  params.rank = static_cast<int>(rank);
  for (size_t d = 0; d < rank; ++d) {
    int64_t axis = perm[d] < 0 ? perm[d] + static_cast<int64_t>(rank) : perm[d];
    params.out_shape[d] = in[axis];
    params.in_strides[d] = strides[axis];
  }
  if (rank == 0) {
    params.rank = 1;
    params.out_shape[0] = 1;
    params.in_strides[0] = 1;
  }
  return l.Launch(EntryPointOf(CudaLauncher::kPermute, p.inputs[0].dtype), GridFor(n, t.sms),
                  kBlock, params, x, y);
}

absl::Status BlasCheck(cublasStatus_t s, absl::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = s == CUBLAS_STATUS_ALLOC_FAILED ? absl::StatusCode::kResourceExhausted
                          : s == CUBLAS_STATUS_EXECUTION_FAILED ? absl::StatusCode::kUnavailable
                                                                : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat(what, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")"));
}

absl::Status Matmul(Launcher& l, const LaunchTarget& t, const Plan& p, CUdeviceptr a, CUdeviceptr b,
                    CUdeviceptr y) {
  kernels::MatmulGeometry g = kernels::MakeMatmulGeometry(p);
  const DType dtype = p.inputs[0].dtype;
  const double alpha = kernels::AttrFloat(p.attrs, "alpha");
  const double beta = kernels::AttrFloat(p.attrs, "beta");
  const int64_t batches = static_cast<int64_t>(g.a_offset.size());
  if (g.m == 0 || g.n == 0 || batches == 0) return absl::OkStatus();
  const size_t esize = kernels::DTypeSize(dtype);
  if (g.k == 0) {  // an empty product: y = beta * y (zeros when beta is 0, as on the CPU)
    const int64_t total = batches * g.m * g.n;
    if (beta == 0) {
      return t.driver->Check(t.driver->cuMemsetD8Async(y, 0, total * esize, t.stream),
                             "clearing matmul output");
    }
    const int64_t n = total;
    return l.Launch(EntryPointOf(CudaLauncher::kMatmul, dtype), GridFor(n, t.sms), kBlock,
                    static_cast<int>(tc::kScale), n, y, y, beta, 0.0);
  }
  if (t.blas == nullptr || !*t.blas) {
    return absl::InternalError("matmul: the tenant has no cuBLAS handle");
  }
  CUresult allocated = CUDA_SUCCESS;
  const cublasStatus_t bound = t.blas->Bind(t.stream, allocated);
  if (allocated != CUDA_SUCCESS) {
    return t.driver->Check(allocated, "allocating the stream's cuBLAS workspace");
  }
  if (absl::Status s = BlasCheck(bound, "binding cuBLAS to the stream"); !s.ok()) return s;
  cudaDataType type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  switch (dtype) {
    case DType::kF16:
      type = CUDA_R_16F;
      break;
    case DType::kBF16:
      type = CUDA_R_16BF;
      break;
    case DType::kF64:
      type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      break;
    default:
      break;
  }
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* alpha_p = compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&alpha)
                                                      : static_cast<const void*>(&alpha_f);
  const void* beta_p = compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&beta)
                                                     : static_cast<const void*>(&beta_f);
  // Row-major y = op(a) op(b) is column-major y^T = op(b)^T op(a)^T: swap the operands.
  const cublasOperation_t op_a = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  auto gemm = [&](int64_t a_off, int64_t b_off, int64_t y_off, int64_t stride_a, int64_t stride_b,
                  int64_t count) {
    return BlasCheck(cublasGemmStridedBatchedEx_64(
                         t.blas->get(), op_b, op_a, g.n, g.m, g.k, alpha_p,
                         reinterpret_cast<const void*>(b + b_off * esize), type, g.ldb, stride_b,
                         reinterpret_cast<const void*>(a + a_off * esize), type, g.lda, stride_a,
                         beta_p, reinterpret_cast<void*>(y + y_off * esize), type, g.n, g.m * g.n,
                         count, compute, CUBLAS_GEMM_DEFAULT),
                     "matmul (cuBLAS)");
  };
  // One strided-batched call when the batch offsets are affine (no batch, or broadcast of a
  // whole operand); otherwise one call per batch.
  const int64_t stride_a = batches > 1 ? g.a_offset[1] - g.a_offset[0] : 0;
  const int64_t stride_b = batches > 1 ? g.b_offset[1] - g.b_offset[0] : 0;
  bool affine = true;
  for (int64_t i = 0; i < batches && affine; ++i) {
    affine = g.a_offset[i] == i * stride_a && g.b_offset[i] == i * stride_b;
  }
  if (affine) return gemm(0, 0, 0, stride_a, stride_b, batches);
  for (int64_t i = 0; i < batches; ++i) {
    absl::Status s = gemm(g.a_offset[i], g.b_offset[i], i * g.m * g.n, 0, 0, 1);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// A generated kernel: element-wise ones compute every output of an element before storing
// any (kernels/expr/cuda_codegen.h), reductions are staged like the catalog's.
absl::Status User(const LaunchTarget& t, const Plan& p, const std::vector<CUdeviceptr>& in,
                  const std::vector<CUdeviceptr>& out) {
  if (p.user == nullptr || t.user == nullptr) {
    return absl::InternalError(
        absl::StrCat("kernel ", p.kernel->name, " reached the CUDA launcher without its module"));
  }
  absl::StatusOr<kernels::expr::CudaLaunch> launch =
      kernels::expr::MakeCudaLaunch(p.user->program, p, std::vector<uint64_t>(in.begin(), in.end()),
                                    std::vector<uint64_t>(out.begin(), out.end()), t.sms);
  if (!launch.ok()) return launch.status();
  if (launch->grid == 0) return absl::OkStatus();
  void* params[] = {launch->params.data()};
  return t.driver->Check(t.driver->cuLaunchKernel(t.user, launch->grid, 1, 1, launch->block, 1, 1,
                                                  0, t.stream, params, nullptr),
                         absl::StrCat("launching kernel ", p.kernel->name));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelTable>> KernelTable::Load(const Driver& driver) {
  std::unique_ptr<KernelTable> table(new KernelTable(driver));
  for (const unsigned char* image : {tessera_fatbin_elementwise, tessera_fatbin_reduce}) {
    CUlibrary library = nullptr;
    absl::Status loaded = driver.Check(
        driver.cuLibraryLoadData(&library, image, nullptr, nullptr, 0, nullptr, nullptr, 0),
        "loading the CUDA kernel library (sm_80, sm_90 and PTX)");
    if (!loaded.ok()) return loaded;
    table->libraries_.push_back(library);
  }
  // Every kernel the launchers may name, resolved once.
  for (const std::string& name : FatbinEntryPoints()) {
    CUkernel kernel = nullptr;
    for (CUlibrary library : table->libraries_) {
      if (driver.cuLibraryGetKernel(&kernel, library, name.c_str()) == CUDA_SUCCESS) break;
      kernel = nullptr;
    }
    if (kernel == nullptr) {
      return absl::InternalError(absl::StrCat("the embedded kernel library lacks ", name));
    }
    table->kernels_.emplace(name, kernel);
  }
  return table;
}

KernelTable::~KernelTable() {
  for (CUlibrary library : libraries_) driver_.cuLibraryUnload(library);
}

absl::Status KernelTable::LoadIntoCurrentContext() const {
  for (const auto& [name, kernel] : kernels_) {
    CUfunction function = nullptr;
    absl::Status loaded = driver_.Check(driver_.cuKernelGetFunction(&function, kernel),
                                        absl::StrCat("loading kernel ", name, " into the context"));
    if (!loaded.ok()) return loaded;
  }
  return absl::OkStatus();
}

absl::StatusOr<CUkernel> KernelTable::Find(const std::string& name) const {
  auto it = kernels_.find(name);
  if (it == kernels_.end()) return absl::NotFoundError(absl::StrCat("no CUDA kernel ", name));
  return it->second;
}

bool AliasSafe(const Plan& plan) {
  if (plan.kernel->op == kernels::Op::kUser) {
    return plan.user != nullptr && !plan.user->program.reduction.has_value();
  }
  return CudaImplOf(plan.kernel->op).alias_safe;
}

bool UsesCublas(const Plan& plan) {
  return CudaImplOf(plan.kernel->op).launcher == CudaLauncher::kMatmul;
}

absl::Status RunStep(const LaunchTarget& t, const Plan& p, const std::vector<CUdeviceptr>& in,
                     const std::vector<CUdeviceptr>& out) {
  Launcher l(t);
  const CudaImpl impl = CudaImplOf(p.kernel->op);
  const int64_t n = kernels::CheckedNumElements(p.outputs[0].shape);
  switch (impl.launcher) {
    case CudaLauncher::kNone:
      break;
    case CudaLauncher::kFill:
      if (n == 0) return absl::OkStatus();
      return l.Launch(EntryPointOf(impl.launcher, p.outputs[0].dtype), GridFor(n, t.sms), kBlock, n,
                      out[0], static_cast<int>(p.outputs[0].dtype),
                      kernels::AttrFloat(p.attrs, "value"));
    case CudaLauncher::kCopy:
      if (n == 0 || in[0] == out[0]) return absl::OkStatus();
      return t.driver->Check(
          t.driver->cuMemcpyDtoDAsync(out[0], in[0], n * kernels::DTypeSize(p.outputs[0].dtype),
                                      t.stream),
          "copy");
    case CudaLauncher::kCast:
      if (n == 0) return absl::OkStatus();
      return l.Launch(EntryPointOf(impl.launcher, p.inputs[0].dtype), GridFor(n, t.sms), kBlock, n,
                      in[0], static_cast<int>(p.inputs[0].dtype), out[0],
                      static_cast<int>(p.outputs[0].dtype));
    case CudaLauncher::kUnary: {
      double alpha = 1, beta = 0;
      if (impl.code == tc::kScale) {
        alpha = kernels::AttrFloat(p.attrs, "alpha");
        beta = kernels::AttrFloat(p.attrs, "beta");
      }
      return Unary(l, t, impl.code, p, in[0], out[0], alpha, beta);
    }
    case CudaLauncher::kBinary:
      return Binary(l, t, impl.code, p, in, out[0]);
    case CudaLauncher::kReduce:
      return Reduce(l, t, impl.code, p, in[0], out[0]);
    case CudaLauncher::kArgmax: {
      tc::AxisParams a = AxisParamsOf(p);
      return Rows(l, t, EntryPointOf(impl.launcher, p.inputs[0].dtype), a, a, in[0], out[0]);
    }
    case CudaLauncher::kSoftmax: {
      tc::AxisParams a = AxisParamsOf(p);
      return Rows(l, t, EntryPointOf(impl.launcher, p.inputs[0].dtype), a, impl.code, a, in[0],
                  out[0]);
    }
    case CudaLauncher::kNorm: {
      const kernels::Shape& shape = p.inputs[0].shape;
      const int64_t width = shape.empty() ? 1 : shape.back();
      const int64_t rows = width == 0 ? 0 : kernels::CheckedNumElements(shape) / width;
      const CUdeviceptr weight = in.size() > 1 ? in[1] : 0;
      const CUdeviceptr bias = in.size() > 2 ? in[2] : 0;
      return Rows(l, t, EntryPointOf(impl.launcher, p.inputs[0].dtype),
                  tc::AxisParams{rows, width, 1}, impl.code, rows, width, in[0], weight, bias,
                  out[0], kernels::AttrFloat(p.attrs, "eps"));
    }
    case CudaLauncher::kPermute:
      return Transpose(l, t, p, in[0], out[0]);
    case CudaLauncher::kMatmul:
      return Matmul(l, t, p, in[0], in[1], out[0]);
    case CudaLauncher::kUser:
      return User(t, p, in, out);
  }
  return absl::InternalError(absl::StrCat("the CUDA backend has no kernel for ", p.kernel->name));
}

}  // namespace tessera::cuda
