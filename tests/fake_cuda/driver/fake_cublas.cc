// A cuBLAS for the fake driver (fake_cuda.cc): libcublas.so.13 with the subset of the API the
// CUDA module calls and its neighbours, computing on the host with OpenBLAS. The real library
// cannot run on the fake driver (it needs a real device), so without this matmul could not
// run in CI at all.
//
// It is as strict as the library is documented to be, and stricter where the library would be
// undefined: a handle is bound to the context current at cublasCreate and its work runs in
// order on the stream set with cublasSetStream, which must be a stream of that context (a
// misuse otherwise, as is the legacy default stream, which the backend never uses); gemm
// arguments are validated as cuBLAS validates them (operations, sizes, leading dimensions,
// the supported combinations of compute, scale and data types); and every matrix span a gemm
// touches, in every batch, must lie inside one allocation of the stream's context when the
// work runs, or the stream faults with CUDA_ERROR_ILLEGAL_ADDRESS as a GPU would. Misuses are
// printed ("fake libcublas: misuse: ...") and counted (tessera_fake_cublas_misuses).
#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <cblas.h>
#include <cublas_api.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

// The fake driver's hooks (fake_cuda.h).
extern "C" {
int tessera_fake_cuda_stream_context(CUstream stream, CUcontext* out);
int tessera_fake_cuda_enqueue(CUstream stream, int (*op)(void*), void* data,
                              void (*release)(void*));
int tessera_fake_cuda_check_range(CUstream stream, unsigned long long ptr, unsigned long long bytes,
                                  char* why, int size);
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status);
}

struct cublasContext {
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // The stream each workspace was set for: one workspace on two streams would be scratch
  // memory two concurrent GEMMs write at once.
  std::map<void*, CUstream> workspace_streams;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

namespace {

std::atomic<int> g_misuses{0};
std::mutex g_mu;
std::set<cublasHandle_t>& Handles() {
  static auto* handles = new std::set<cublasHandle_t>();
  return *handles;
}

void Misuse(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  std::fprintf(stderr, "fake libcublas: misuse: %s\n", text);
  g_misuses.fetch_add(1);
}

bool Known(cublasHandle_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  return handle != nullptr && Handles().count(handle) != 0;
}

CUcontext CurrentContext() {
  using GetCurrent = CUresult (*)(CUcontext*);
  static GetCurrent get = [] {
    void* fn = nullptr;
    cuGetProcAddress_v2("cuCtxGetCurrent", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
    return reinterpret_cast<GetCurrent>(fn);
  }();
  CUcontext context = nullptr;
  if (get == nullptr || get(&context) != CUDA_SUCCESS) return nullptr;
  return context;
}

size_t SizeOf(cudaDataType type) {
  switch (type) {
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    case CUDA_R_32F:
      return 4;
    case CUDA_R_64F:
      return 8;
    default:
      return 0;
  }
}

// The combinations of cublasGemmEx's table this fake computes (all real-valued ones the
// library supports for these types); NOT_SUPPORTED for the rest, as the library answers.
bool Supported(cublasComputeType_t compute, cudaDataType a, cudaDataType b, cudaDataType c) {
  if (a != b) return false;
  switch (compute) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
      return a == CUDA_R_16F && c == CUDA_R_16F;
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      return (a == CUDA_R_16F && (c == CUDA_R_16F || c == CUDA_R_32F)) ||
             (a == CUDA_R_16BF && (c == CUDA_R_16BF || c == CUDA_R_32F)) ||
             (a == CUDA_R_32F && c == CUDA_R_32F);
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      return a == CUDA_R_32F && c == CUDA_R_32F;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
      return a == CUDA_R_64F && c == CUDA_R_64F;
    default:
      return false;
  }
}

bool Compute64(cublasComputeType_t compute) {
  return compute == CUBLAS_COMPUTE_64F || compute == CUBLAS_COMPUTE_64F_PEDANTIC;
}
bool Compute16(cublasComputeType_t compute) {
  return compute == CUBLAS_COMPUTE_16F || compute == CUBLAS_COMPUTE_16F_PEDANTIC;
}

double Load(const void* base, cudaDataType type, int64_t i) {
  switch (type) {
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(base)[i]);
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case CUDA_R_32F:
      return static_cast<const float*>(base)[i];
    default:
      return static_cast<const double*>(base)[i];
  }
}

void Store(void* base, cudaDataType type, int64_t i, double v) {
  switch (type) {
    case CUDA_R_16F:
      static_cast<__half*>(base)[i] = __float2half_rn(static_cast<float>(v));
      return;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(static_cast<float>(v));
      return;
    case CUDA_R_32F:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    default:
      static_cast<double*>(base)[i] = v;
      return;
  }
}

// One gemm call's work, run on the stream.
struct Gemm {
  CUstream stream;
  cublasOperation_t ta, tb;
  int64_t m, n, k;
  double alpha, beta;
  const void* alpha_device = nullptr;  // CUBLAS_POINTER_MODE_DEVICE: read when it runs
  const void* beta_device = nullptr;
  const char* a;
  const char* b;
  char* c;
  cudaDataType type_a, type_c;
  int64_t lda, ldb, ldc, stride_a, stride_b, stride_c, batches;
  cublasComputeType_t compute;
};

// Bytes of a column-major `rows` x `cols` matrix with leading dimension `ld`.
uint64_t Span(int64_t rows, int64_t cols, int64_t ld, size_t element) {
  if (rows == 0 || cols == 0) return 0;
  return static_cast<uint64_t>((cols - 1) * ld + rows) * element;
}

CUresult Check(const Gemm& g, const void* ptr, uint64_t bytes, const char* what, int64_t batch) {
  char why[256] = {};
  if (tessera_fake_cuda_check_range(g.stream, reinterpret_cast<unsigned long long>(ptr), bytes, why,
                                    sizeof(why)) == CUDA_SUCCESS) {
    return CUDA_SUCCESS;
  }
  std::fprintf(stderr, "fake libcublas: device fault: gemm %s of batch %lld: %s\n", what,
               static_cast<long long>(batch), why);
  return CUDA_ERROR_ILLEGAL_ADDRESS;
}

// Runs the GEMM `data` describes; the driver releases it (a graph may run it again).
int RunGemm(void* data) {
  const Gemm* g = static_cast<const Gemm*>(data);
  const size_t ea = SizeOf(g->type_a), ec = SizeOf(g->type_c);
  const int64_t a_rows = g->ta == CUBLAS_OP_N ? g->m : g->k;
  const int64_t a_cols = g->ta == CUBLAS_OP_N ? g->k : g->m;
  const int64_t b_rows = g->tb == CUBLAS_OP_N ? g->k : g->n;
  const int64_t b_cols = g->tb == CUBLAS_OP_N ? g->n : g->k;
  double alpha = g->alpha, beta = g->beta;
  if (g->alpha_device != nullptr) {
    const size_t scale = Compute64(g->compute) ? 8 : Compute16(g->compute) ? 2 : 4;
    if (CUresult r = Check(*g, g->alpha_device, scale, "alpha", 0); r != CUDA_SUCCESS) return r;
    if (CUresult r = Check(*g, g->beta_device, scale, "beta", 0); r != CUDA_SUCCESS) return r;
    const cudaDataType st = Compute64(g->compute)   ? CUDA_R_64F
                            : Compute16(g->compute) ? CUDA_R_16F
                                                    : CUDA_R_32F;
    alpha = Load(g->alpha_device, st, 0);
    beta = Load(g->beta_device, st, 0);
  }
  for (int64_t batch = 0; batch < g->batches; ++batch) {
    const char* a = g->a + batch * g->stride_a * static_cast<int64_t>(ea);
    const char* b = g->b + batch * g->stride_b * static_cast<int64_t>(ea);
    char* c = g->c + batch * g->stride_c * static_cast<int64_t>(ec);
    if (g->k > 0) {
      if (CUresult r = Check(*g, a, Span(a_rows, a_cols, g->lda, ea), "A", batch);
          r != CUDA_SUCCESS) {
        return r;
      }
      if (CUresult r = Check(*g, b, Span(b_rows, b_cols, g->ldb, ea), "B", batch);
          r != CUDA_SUCCESS) {
        return r;
      }
    }
    if (CUresult r = Check(*g, c, Span(g->m, g->n, g->ldc, ec), "C", batch); r != CUDA_SUCCESS) {
      return r;
    }
    const CBLAS_TRANSPOSE ta = g->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    const CBLAS_TRANSPOSE tb = g->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    if (g->type_a == CUDA_R_64F) {
      cblas_dgemm(CblasColMajor, ta, tb, static_cast<int>(g->m), static_cast<int>(g->n),
                  static_cast<int>(g->k), alpha, reinterpret_cast<const double*>(a),
                  static_cast<int>(g->lda), reinterpret_cast<const double*>(b),
                  static_cast<int>(g->ldb), beta, reinterpret_cast<double*>(c),
                  static_cast<int>(g->ldc));
      continue;
    }
    if (g->type_a == CUDA_R_32F && g->type_c == CUDA_R_32F) {
      cblas_sgemm(CblasColMajor, ta, tb, static_cast<int>(g->m), static_cast<int>(g->n),
                  static_cast<int>(g->k), static_cast<float>(alpha),
                  reinterpret_cast<const float*>(a), static_cast<int>(g->lda),
                  reinterpret_cast<const float*>(b), static_cast<int>(g->ldb),
                  static_cast<float>(beta), reinterpret_cast<float*>(c), static_cast<int>(g->ldc));
      continue;
    }
    // Narrow types: widened to f32 (packed), accumulated in f32, rounded once on the store;
    // beta == 0 never reads C (NaN there does not propagate), as in cuBLAS.
    std::vector<float> wa(static_cast<size_t>(a_rows * a_cols));
    std::vector<float> wb(static_cast<size_t>(b_rows * b_cols));
    std::vector<float> wc(static_cast<size_t>(g->m * g->n), 0.0f);
    for (int64_t j = 0; j < a_cols; ++j) {
      for (int64_t i = 0; i < a_rows; ++i) {
        wa[static_cast<size_t>(j * a_rows + i)] =
            static_cast<float>(Load(a, g->type_a, j * g->lda + i));
      }
    }
    for (int64_t j = 0; j < b_cols; ++j) {
      for (int64_t i = 0; i < b_rows; ++i) {
        wb[static_cast<size_t>(j * b_rows + i)] =
            static_cast<float>(Load(b, g->type_a, j * g->ldb + i));
      }
    }
    if (beta != 0) {
      for (int64_t j = 0; j < g->n; ++j) {
        for (int64_t i = 0; i < g->m; ++i) {
          wc[static_cast<size_t>(j * g->m + i)] =
              static_cast<float>(Load(c, g->type_c, j * g->ldc + i));
        }
      }
    }
    if (g->k > 0) {
      cblas_sgemm(CblasColMajor, ta, tb, static_cast<int>(g->m), static_cast<int>(g->n),
                  static_cast<int>(g->k), static_cast<float>(alpha), wa.data(),
                  static_cast<int>(a_rows), wb.data(), static_cast<int>(b_rows),
                  static_cast<float>(beta), wc.data(), static_cast<int>(g->m));
    } else {
      for (float& v : wc) v *= static_cast<float>(beta);
    }
    for (int64_t j = 0; j < g->n; ++j) {
      for (int64_t i = 0; i < g->m; ++i) {
        Store(c, g->type_c, j * g->ldc + i, wc[static_cast<size_t>(j * g->m + i)]);
      }
    }
  }
  return CUDA_SUCCESS;
}

cublasStatus_t GemmBatched(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                           int64_t m, int64_t n, int64_t k, const void* alpha, const void* a,
                           cudaDataType type_a, int64_t lda, int64_t stride_a, const void* b,
                           cudaDataType type_b, int64_t ldb, int64_t stride_b, const void* beta,
                           void* c, cudaDataType type_c, int64_t ldc, int64_t stride_c,
                           int64_t batches, cublasComputeType_t compute, const char* call) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto op_ok = [](cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || batches < 0 ||
      lda < std::max<int64_t>(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max<int64_t>(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max<int64_t>(1, m) ||
      alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!Supported(compute, type_a, type_b, type_c)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
      ldc > INT32_MAX) {
    return CUBLAS_STATUS_NOT_SUPPORTED;  // beyond what this host implementation handles
  }
  if (m == 0 || n == 0 || batches == 0) return CUBLAS_STATUS_SUCCESS;
  if (handle->stream == nullptr) {
    Misuse("%s on the legacy default stream (the backend sets its own with cublasSetStream)", call);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (handle->workspace == nullptr) {
    // Legal for cuBLAS, but then it takes memory of its own that the tenant is not charged
    // for: the backend gives every handle a workspace (after each cublasSetStream).
    Misuse("%s with cuBLAS's default workspace (cublasSetWorkspace after cublasSetStream)", call);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  CUcontext stream_context = nullptr;
  if (tessera_fake_cuda_stream_context(handle->stream, &stream_context) != CUDA_SUCCESS ||
      stream_context != handle->context) {
    Misuse("%s with a handle of one context on a stream of another", call);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  auto work = std::make_unique<Gemm>();
  Gemm& g = *work;
  g.stream = handle->stream;
  g.ta = ta;
  g.tb = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  if (handle->pointer_mode == CUBLAS_POINTER_MODE_HOST) {
    const cudaDataType scale = Compute64(compute)   ? CUDA_R_64F
                               : Compute16(compute) ? CUDA_R_16F
                                                    : CUDA_R_32F;
    g.alpha = Load(alpha, scale, 0);
    g.beta = Load(beta, scale, 0);
  } else {
    g.alpha_device = alpha;
    g.beta_device = beta;
  }
  g.a = static_cast<const char*>(a);
  g.b = static_cast<const char*>(b);
  g.c = static_cast<char*>(c);
  g.type_a = type_a;
  g.type_c = type_c;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_c = stride_c;
  g.batches = batches;
  g.compute = compute;
  // The driver owns it from here, even when it refuses it.
  if (tessera_fake_cuda_enqueue(handle->stream, &RunGemm, work.release(), [](void* data) {
        delete static_cast<Gemm*>(data);
      }) != CUDA_SUCCESS) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

FAKE_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  CUcontext context = CurrentContext();
  if (context == nullptr) {
    Misuse("cublasCreate without a current context");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  auto* h = new cublasContext();
  h->context = context;
  std::lock_guard<std::mutex> lock(g_mu);
  Handles().insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (handle == nullptr || Handles().erase(handle) == 0) {
    Misuse("cublasDestroy of a handle that is not live");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = reinterpret_cast<CUstream>(stream);
  // cuBLAS's documentation: cublasSetStream "unconditionally resets the cuBLAS library
  // workspace back to the default workspace pool".
  handle->workspace = nullptr;
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = reinterpret_cast<cudaStream_t>(handle->stream);
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                 size_t bytes) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  // The documented requirement: at least 256-byte aligned.
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (workspace == nullptr && bytes != 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (workspace != nullptr) {
    auto [it, added] = handle->workspace_streams.emplace(workspace, handle->stream);
    if (!added && it->second != handle->stream) {
      Misuse(
          "cublasSetWorkspace: workspace %p, set for one stream, set again for another "
          "(two streams' GEMMs would share its scratch memory)",
          workspace);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle,
                                                   cublasPointerMode_t mode) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle,
                                                   cublasPointerMode_t* mode) {
  if (!Known(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasGemmStridedBatchedEx_64(
    cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
    int64_t k, const void* alpha, const void* a, cudaDataType type_a, int64_t lda,
    long long stride_a, const void* b, cudaDataType type_b, int64_t ldb, long long stride_b,
    const void* beta, void* c, cudaDataType type_c, int64_t ldc, long long stride_c,
    int64_t batches, cublasComputeType_t compute, cublasGemmAlgo_t) {
  return GemmBatched(handle, ta, tb, m, n, k, alpha, a, type_a, lda, stride_a, b, type_b, ldb,
                     stride_b, beta, c, type_c, ldc, stride_c, batches, compute,
                     "cublasGemmStridedBatchedEx_64");
}

FAKE_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void* alpha, const void* a, cudaDataType type_a, int lda, long long stride_a,
    const void* b, cudaDataType type_b, int ldb, long long stride_b, const void* beta, void* c,
    cudaDataType type_c, int ldc, long long stride_c, int batches, cublasComputeType_t compute,
    cublasGemmAlgo_t) {
  return GemmBatched(handle, ta, tb, m, n, k, alpha, a, type_a, lda, stride_a, b, type_b, ldb,
                     stride_b, beta, c, type_c, ldc, stride_c, batches, compute,
                     "cublasGemmStridedBatchedEx");
}

FAKE_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta,
                                        cublasOperation_t tb, int m, int n, int k,
                                        const void* alpha, const void* a, cudaDataType type_a,
                                        int lda, const void* b, cudaDataType type_b, int ldb,
                                        const void* beta, void* c, cudaDataType type_c, int ldc,
                                        cublasComputeType_t compute, cublasGemmAlgo_t) {
  return GemmBatched(handle, ta, tb, m, n, k, alpha, a, type_a, lda, 0, b, type_b, ldb, 0, beta, c,
                     type_c, ldc, 0, 1, compute, "cublasGemmEx");
}

FAKE_EXPORT const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

FAKE_EXPORT const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "error detected trying to check the license";
  }
  return "unknown error";
}

FAKE_EXPORT int tessera_fake_cublas_misuses() { return g_misuses.load(); }
