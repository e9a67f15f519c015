// How the fake driver runs kernels (tests/fake_cuda/driver/device_runtime.cc) and the fake
// cuBLAS beside it computes (fake_cublas.cc), on the driver and cuBLAS APIs directly: our CUDA
// sources compiled for the host run every thread of every block with CUDA's barrier and warp
// semantics, and every access a GPU would refuse stops the launch with a sticky error and a message
// naming the kernel, block, thread and address. The kernels are
// tests/fake_cuda/driver/test_kernels.cu and kernels/cuda/elementwise.cu, loaded from the fatbins
// nvcc built, as the backend loads its own.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_fp16.h>
#include <dlfcn.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "kernels/cuda/params.h"
#include "tests/fake_cuda/driver/fake_cuda.h"
#include "tests/fake_cuda/driver_api.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// clang-format off
#define FAKE_KERNEL_TEST_ENTRIES(X)                                                       \
  X(cuInit) X(cuCtxCreate) X(cuCtxDestroy) X(cuCtxPushCurrent) X(cuCtxPopCurrent)         \
  X(cuStreamCreateWithPriority) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuMemAlloc)   \
  X(cuMemFree) X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel)              \
  X(cuLaunchKernel)
// clang-format on

std::string ReadFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class FakeCudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::GetProcAddress get_proc = nullptr;
    ASSERT_NO_FATAL_FAILURE(testing::OpenFakeDriver(&library_, &fake_, &get_proc));
#define FAKE_KERNEL_TEST_FETCH(name) testing::FetchEntry(get_proc, #name, name);
    FAKE_KERNEL_TEST_ENTRIES(FAKE_KERNEL_TEST_FETCH)
#undef FAKE_KERNEL_TEST_FETCH
    if (HasFatalFailure()) return;  // an entry point is missing
    fake_->Reset();
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    test_image_ = ReadFile(TESSERA_TEST_KERNELS_FATBIN);
    elementwise_image_ = ReadFile(TESSERA_ELEMENTWISE_FATBIN);
    ASSERT_FALSE(test_image_.empty()) << TESSERA_TEST_KERNELS_FATBIN;
    ASSERT_FALSE(elementwise_image_.empty()) << TESSERA_ELEMENTWISE_FATBIN;
  }

  void TearDown() override {
    if (fake_) {
      EXPECT_EQ(fake_->misuses(), 0);
      std::string leaks;
      EXPECT_EQ(fake_->Leaks(&leaks), 0) << leaks;
    }
    if (library_ != nullptr) dlclose(library_);
  }

  // A context with a stream and the two libraries, destroyed in order at the end of a test.
  struct Device {
    CUcontext context = nullptr;
    CUstream stream = nullptr;
    CUlibrary tests = nullptr, elementwise = nullptr;
    std::vector<CUdeviceptr> memory;
  };

  void Open(Device& d) {
    ASSERT_EQ(cuCtxCreate(&d.context, nullptr, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreateWithPriority(&d.stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    ASSERT_EQ(
        cuLibraryLoadData(&d.tests, test_image_.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
        CUDA_SUCCESS);
    ASSERT_EQ(cuLibraryLoadData(&d.elementwise, elementwise_image_.data(), nullptr, nullptr, 0,
                                nullptr, nullptr, 0),
              CUDA_SUCCESS);
  }

  // `d` is current when this is called and stays so.
  template <typename T>
  T* Alloc(Device& d, size_t count) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc(&p, count * sizeof(T)), CUDA_SUCCESS);
    d.memory.push_back(p);
    return reinterpret_cast<T*>(p);  // the fake's device memory is host memory
  }

  void Close(Device& d) {
    for (CUdeviceptr p : d.memory) cuMemFree(p);  // fails (ignored) once the context faulted
    cuStreamDestroy(d.stream);
    cuLibraryUnload(d.tests);
    cuLibraryUnload(d.elementwise);
    cuCtxDestroy(d.context);  // pops it if current
  }

  CUresult Launch(CUlibrary library, const char* name, unsigned grid, unsigned block,
                  CUstream stream, std::vector<void*> params) {
    CUkernel kernel = nullptr;
    if (CUresult r = cuLibraryGetKernel(&kernel, library, name); r != CUDA_SUCCESS) return r;
    if (CUresult r = cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), grid, 1, 1, block, 1, 1,
                                    0, stream, params.data(), nullptr);
        r != CUDA_SUCCESS) {
      return r;
    }
    return cuStreamSynchronize(stream);
  }

  std::string LastFault() {
    std::string last;
    fake_->DeviceErrors(&last);
    return last;
  }

  void* library_ = nullptr;
  std::optional<testing::FakeCudaDriver> fake_;
  std::string test_image_, elementwise_image_;
#define FAKE_KERNEL_TEST_MEMBER(name) decltype(&::name) name = nullptr;
  FAKE_KERNEL_TEST_ENTRIES(FAKE_KERNEL_TEST_MEMBER)
#undef FAKE_KERNEL_TEST_MEMBER
};

TEST_F(FakeCudaKernelsTest, BarriersShufflesAndBallotsHaveCudasSemantics) {
  Device d;
  Open(d);
  constexpr unsigned kBlocks = 3, kThreads = 256, kAll = kBlocks * kThreads;
  int* reversed = Alloc<int>(d, kAll);
  int* warp_sum = Alloc<int>(d, kAll);
  unsigned* odd = Alloc<unsigned>(d, kAll);
  ASSERT_EQ(Launch(d.tests, "tessera_test_collectives", kBlocks, kThreads, d.stream,
                   {&reversed, &warp_sum, &odd}),
            CUDA_SUCCESS)
      << LastFault();
  for (unsigned i = 0; i < kAll; ++i) {
    const unsigned t = i % kThreads, warp = t / 32;
    ASSERT_EQ(reversed[i], static_cast<int>(kThreads - 1 - t)) << i;
    // The xor butterfly gives every lane the sum of its warp's thread indices.
    ASSERT_EQ(warp_sum[i], static_cast<int>(32 * 32 * warp + 31 * 32 / 2)) << i;
    ASSERT_EQ(odd[i], 0xAAAAAAAAu) << i;
  }
  EXPECT_EQ(fake_->DeviceErrors(nullptr), 0);
  Close(d);
}

TEST_F(FakeCudaKernelsTest, OurKernelsRunEveryThreadOfEveryBlock) {
  Device d;
  Open(d);
  // Not a multiple of the block, nor of a 16-byte pack, and more than the grid covers at once.
  constexpr int64_t kN = 100003;
  float* x = Alloc<float>(d, kN);
  float* y = Alloc<float>(d, kN);
  for (int64_t i = 0; i < kN; ++i) x[i] = static_cast<float>(i);
  int op = tessera_cuda::kNeg;
  int64_t n = kN;
  double alpha = 0, beta = 0;
  for (unsigned grid : {1u, 7u, 512u}) {
    std::memset(y, 0, kN * sizeof(float));
    ASSERT_EQ(Launch(d.elementwise, "tessera_unary_f32", grid, 128, d.stream,
                     {&op, &n, &x, &y, &alpha, &beta}),
              CUDA_SUCCESS)
        << LastFault();
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(y[i], -static_cast<float>(i)) << i;
  }
  Close(d);
}

TEST_F(FakeCudaKernelsTest, AStorePastTheEndIsAnIllegalAddressNamingKernelThreadAndAddress) {
  Device d;
  Open(d);
  float* y = Alloc<float>(d, 100);
  int64_t n = 100;
  EXPECT_EQ(Launch(d.tests, "tessera_test_store_past_end", 2, 64, d.stream, {&y, &n}),
            CUDA_ERROR_ILLEGAL_ADDRESS);
  char address[32];
  std::snprintf(address, sizeof(address), "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(y + 100)));
  EXPECT_THAT(LastFault(),
              AllOf(HasSubstr("kernel tessera_test_store_past_end, block (0,0,0), thread (0,0,0)"),
                    HasSubstr(std::string("4-byte store at ") + address),
                    HasSubstr("4 bytes past the end of the 400-byte allocation")));
  EXPECT_EQ(fake_->DeviceErrors(nullptr), 1);
  // Sticky, as on a GPU: the context runs nothing more.
  float* other = y;
  int64_t zero = 0;
  EXPECT_EQ(Launch(d.tests, "tessera_test_store_past_end", 1, 32, d.stream, {&other, &zero}),
            CUDA_ERROR_ILLEGAL_ADDRESS);
  Close(d);
}

TEST_F(FakeCudaKernelsTest, AnotherContextsPointerIsAnIllegalAddress) {
  Device victim, thief;
  Open(victim);
  float* secret = Alloc<float>(victim, 64);
  for (int i = 0; i < 64; ++i) secret[i] = 42.0f;
  Open(thief);  // now current
  float* loot = Alloc<float>(thief, 64);
  std::memset(loot, 0, 64 * sizeof(float));
  int64_t n = 64;
  EXPECT_EQ(Launch(thief.tests, "tessera_test_copy", 1, 64, thief.stream, {&secret, &loot, &n}),
            CUDA_ERROR_ILLEGAL_ADDRESS);
  char address[32];
  std::snprintf(address, sizeof(address), "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(secret)));
  EXPECT_THAT(LastFault(), AllOf(HasSubstr("kernel tessera_test_copy, block (0,0,0), thread "
                                           "(0,0,0): 4-byte load at "),
                                 HasSubstr("memory of another context"), HasSubstr(address)));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(loot[i], 0.0f) << "the load must not happen";
  Close(thief);
  // The victim's memory is untouched, but its context has the error too: an illegal address
  // is fatal to the whole process (as on an H100, where another context's next call failed
  // with it), and no new context can be made.
  EXPECT_EQ(secret[0], 42.0f);
  ASSERT_EQ(cuCtxPushCurrent(victim.context), CUDA_SUCCESS);
  CUdeviceptr more = 0;
  EXPECT_EQ(cuMemAlloc(&more, 256), CUDA_ERROR_ILLEGAL_ADDRESS);
  Close(victim);
  CUcontext refused = nullptr;
  EXPECT_EQ(cuCtxCreate(&refused, nullptr, 0, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
}

TEST_F(FakeCudaKernelsTest, MisusedSharedMemoryAndWarpIntrinsicsFailTheLaunch) {
  struct Case {
    const char* kernel;
    unsigned block;
    const char* says;
  };
  const Case cases[] = {
      {"tessera_test_shared_unwritten", 64, "thread (63,0,0): 4-byte shared-memory load at offset"},
      {"tessera_test_shuffle_mask", 32,
       "__shfl_down_sync with mask 0x0000ffff: lane 0 reads lane 16, which is not in the mask"},
      {"tessera_test_divergent_barrier", 32,
       "deadlock: 16 threads wait at __syncthreads and 16 at a warp operation"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.kernel);
    fake_->NewProcess();  // each launch failure below is fatal to the process
    Device d;
    Open(d);
    int* y = Alloc<int>(d, 64);
    EXPECT_EQ(Launch(d.tests, c.kernel, 1, c.block, d.stream, {&y}), CUDA_ERROR_LAUNCH_FAILED);
    EXPECT_THAT(LastFault(),
                AllOf(HasSubstr(std::string("kernel ") + c.kernel), HasSubstr(c.says)));
    Close(d);
  }
}

// ---- the fake cuBLAS ----------------------------------------------------------------------

int CublasMisuses() {
  void* fake = dlopen("libcublas.so.13", RTLD_NOW | RTLD_NOLOAD);
  auto count = fake == nullptr
                   ? nullptr
                   : reinterpret_cast<int (*)()>(dlsym(fake, "tessera_fake_cublas_misuses"));
  const int n = count == nullptr ? -1 : count();
  if (fake != nullptr) dlclose(fake);
  return n;
}

// Column-major C = alpha op(A) op(B) + beta C, in double.
std::vector<double> Reference(bool ta, bool tb, int m, int n, int k, double alpha,
                              const std::vector<float>& a, int lda, const std::vector<float>& b,
                              int ldb, double beta, const std::vector<float>& c, int ldc) {
  std::vector<double> out(static_cast<size_t>(ldc) * n);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        const double x =
            ta ? a[static_cast<size_t>(i) * lda + p] : a[static_cast<size_t>(p) * lda + i];
        const double y =
            tb ? b[static_cast<size_t>(p) * ldb + j] : b[static_cast<size_t>(j) * ldb + p];
        sum += x * y;
      }
      const size_t at = static_cast<size_t>(j) * ldc + i;
      out[at] = alpha * sum + (beta == 0 ? 0 : beta * c[at]);
    }
  }
  return out;
}

TEST_F(FakeCudaKernelsTest, CublasComputesWhatCublasDocumentsAndChecksWhatItTouches) {
  const int misuses_before = CublasMisuses();
  ASSERT_GE(misuses_before, 0) << "libcublas.so.13 is not the fake";
  cublasHandle_t none = nullptr;
  EXPECT_EQ(cublasCreate(&none), CUBLAS_STATUS_NOT_INITIALIZED);  // no current context
  EXPECT_EQ(CublasMisuses(), misuses_before + 1);

  Device d;
  Open(d);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(h, reinterpret_cast<cudaStream_t>(d.stream)), CUBLAS_STATUS_SUCCESS);
  // C (5x3, ldc 7) = 0.5 A^T (A stored 4x5, lda 6) B (4x3, ldb 4) + 2 C.
  const int m = 5, n = 3, k = 4, lda = 6, ldb = 4, ldc = 7;
  float* a = Alloc<float>(d, lda * m);
  float* b = Alloc<float>(d, ldb * n);
  float* c = Alloc<float>(d, ldc * n);
  // cublasSetStream left the handle on cuBLAS's own workspace pool (as documented): a gemm
  // there is flagged, since the backend charges tenants for the workspace it gives.
  {
    const float one = 1;
    EXPECT_EQ(cublasGemmStridedBatchedEx_64(
                  h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, c, CUDA_R_32F, 2, 0, c, CUDA_R_32F, 2,
                  0, &one, c, CUDA_R_32F, 2, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_EXECUTION_FAILED);
    EXPECT_EQ(CublasMisuses(), misuses_before + 2);
  }
  char* workspace = Alloc<char>(d, 1 << 16);
  ASSERT_EQ(cublasSetWorkspace(h, workspace, 1 << 16), CUBLAS_STATUS_SUCCESS);
  std::vector<float> ha(lda * m), hb(ldb * n), hc(ldc * n);
  for (size_t i = 0; i < ha.size(); ++i) ha[i] = static_cast<float>(i % 7) - 3;
  for (size_t i = 0; i < hb.size(); ++i) hb[i] = static_cast<float>(i % 5) * 0.5f;
  for (size_t i = 0; i < hc.size(); ++i) hc[i] = static_cast<float>(i);
  std::memcpy(a, ha.data(), ha.size() * 4);
  std::memcpy(b, hb.data(), hb.size() * 4);
  std::memcpy(c, hc.data(), hc.size() * 4);
  const float alpha = 0.5f, beta = 2.0f;
  ASSERT_EQ(cublasGemmStridedBatchedEx_64(
                h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_32F, lda, 0, b, CUDA_R_32F,
                ldb, 0, &beta, c, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(d.stream), CUDA_SUCCESS);
  const std::vector<double> want =
      Reference(true, false, m, n, k, alpha, ha, lda, hb, ldb, beta, hc, ldc);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < ldc; ++i) {
      const size_t at = static_cast<size_t>(j) * ldc + i;
      // Rows past m are padding: untouched.
      EXPECT_FLOAT_EQ(c[at], i < m ? static_cast<float>(want[at]) : hc[at]) << i << "," << j;
    }
  }
  // beta = 0: C is not read, so NaN there does not come back.
  for (int i = 0; i < ldc * n; ++i) c[i] = std::nanf("");
  const float zero = 0;
  ASSERT_EQ(cublasGemmStridedBatchedEx_64(
                h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_32F, lda, 0, b, CUDA_R_32F,
                ldb, 0, &zero, c, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(d.stream), CUDA_SUCCESS);
  EXPECT_FALSE(std::isnan(c[0]));
  // f16 in and out, f32 compute: one rounding of the f32 result.
  __half* a16 = Alloc<__half>(d, 4);
  __half* c16 = Alloc<__half>(d, 1);
  const float third = 1.0f / 3;
  for (int i = 0; i < 4; ++i) a16[i] = __float2half_rn(third);
  ASSERT_EQ(
      cublasGemmStridedBatchedEx_64(h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 4, &alpha, a16, CUDA_R_16F,
                                    4, 0, a16, CUDA_R_16F, 4, 0, &zero, c16, CUDA_R_16F, 1, 0, 1,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(d.stream), CUDA_SUCCESS);
  const float h3 = __half2float(__float2half_rn(third));
  EXPECT_EQ(__half2float(c16[0]), __half2float(__float2half_rn(0.5f * 4 * h3 * h3)));

  // What cuBLAS refuses: a leading dimension below the rows stored, a type combination
  // outside its table.
  EXPECT_EQ(
      cublasGemmStridedBatchedEx_64(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_32F,
                                    m - 1, 0, b, CUDA_R_32F, ldb, 0, &beta, c, CUDA_R_32F, ldc, 0,
                                    1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasGemmStridedBatchedEx_64(
                h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16F, lda, 0, b, CUDA_R_16F,
                ldb, 0, &beta, c, CUDA_R_64F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(CublasMisuses(), misuses_before + 2);
  // A second batch whose C runs past its allocation faults the stream, as a GPU would.
  ASSERT_EQ(
      cublasGemmStridedBatchedEx_64(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_32F,
                                    lda, 0, b, CUDA_R_32F, ldb, 0, &beta, c, CUDA_R_32F, ldc,
                                    ldc * n, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(d.stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  Close(d);
}

TEST_F(FakeCudaKernelsTest, ACublasHandleWorksOnlyOnStreamsOfItsContext) {
  const int misuses_before = CublasMisuses();
  Device first, second;
  Open(first);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);  // bound to `first`
  float* x = Alloc<float>(first, 4);
  Open(second);
  ASSERT_EQ(cublasSetStream(h, reinterpret_cast<cudaStream_t>(second.stream)),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetWorkspace(h, x, 16), CUBLAS_STATUS_SUCCESS);
  const float one = 1;
  EXPECT_EQ(cublasGemmStridedBatchedEx_64(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, x, CUDA_R_32F,
                                          2, 0, x, CUDA_R_32F, 2, 0, &one, x, CUDA_R_32F, 2, 0, 1,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_EQ(CublasMisuses(), misuses_before + 1);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_NOT_INITIALIZED);  // not live any more
  EXPECT_EQ(CublasMisuses(), misuses_before + 2);
  Close(second);
  ASSERT_EQ(cuCtxPushCurrent(first.context), CUDA_SUCCESS);
  Close(first);
}

}  // namespace
}  // namespace tessera
