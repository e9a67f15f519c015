// The fake driver's own accounting (tests/fake_cuda/driver), on the driver API directly:
// objects destroyed in order leave nothing counted, and what outlives its context is counted
// by how CUDA ends it (freed with a healthy plain context, outliving a green one, freed with a
// faulted one); host registration and the count of copies by host memory. The backend's
// tests (fake_cuda_test.cc, fake_cuda_regions_test.cc, gpu_test.cc) rely on these counts.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <cuda.h>
#include <dlfcn.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/fake_cuda/driver/fake_cuda.h"
#include "tests/fake_cuda/driver_api.h"

namespace tessera {
namespace {

using testing::FakeCudaKind;
using ::testing::HasSubstr;

// The fake's entry points, fetched as the backend fetches them.
// clang-format off
#define FAKE_CUDA_TEST_ENTRIES(X)                                                        \
  X(cuInit) X(cuCtxCreate) X(cuCtxDestroy) X(cuCtxPushCurrent) X(cuCtxPopCurrent)        \
  X(cuStreamCreateWithPriority) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuEventCreate) \
  X(cuEventDestroy) X(cuMemAlloc) X(cuMemFree) X(cuMemHostAlloc) X(cuMemFreeHost)         \
  X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuLaunchKernel)        \
  X(cuDeviceGetDevResource) X(cuDevSmResourceSplitByCount) X(cuDevResourceGenerateDesc)  \
  X(cuGreenCtxCreate) X(cuGreenCtxDestroy) X(cuCtxFromGreenCtx) X(cuGreenCtxStreamCreate)  \
  X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)
// clang-format on

class FakeCudaDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::GetProcAddress get_proc = nullptr;
    ASSERT_NO_FATAL_FAILURE(testing::OpenFakeDriver(&library_, &fake_, &get_proc));
#define FAKE_CUDA_TEST_FETCH(name) testing::FetchEntry(get_proc, #name, name);
    FAKE_CUDA_TEST_ENTRIES(FAKE_CUDA_TEST_FETCH)
#undef FAKE_CUDA_TEST_FETCH
    if (HasFatalFailure()) return;  // an entry point is missing
    fake_->Reset();
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  }

  // The tests leak on purpose; the counts are checked in their bodies.
  void TearDown() override {
    if (fake_) fake_->Reset();
    if (library_ != nullptr) dlclose(library_);
  }

  /// A green context of one 8-SM group of device 0.
  CUgreenCtx Green() {
    CUdevResource sm{}, group{};
    unsigned int groups = 1;
    CUdevResourceDesc desc = nullptr;
    CUgreenCtx green = nullptr;
    EXPECT_EQ(cuDeviceGetDevResource(0, &sm, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    EXPECT_EQ(cuDevSmResourceSplitByCount(&group, &groups, &sm, nullptr, 0, 8), CUDA_SUCCESS);
    EXPECT_EQ(cuDevResourceGenerateDesc(&desc, &group, 1), CUDA_SUCCESS);
    EXPECT_EQ(cuGreenCtxCreate(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
    return green;
  }

  /// Faults the stream's context as a kernel's illegal address would (`context` current).
  void Fault(CUstream stream) {
    // A kernel library the fake accepts: a fatbin header, then the kernel's name.
    static constexpr char kName[] = "tessera_test_fault";
    std::vector<unsigned char> image(16 + sizeof(kName));
    const uint32_t magic = 0xBA55ED50u;
    const uint16_t header = 16;
    const uint64_t body = sizeof(kName);
    std::memcpy(image.data(), &magic, 4);
    std::memcpy(image.data() + 6, &header, 2);
    std::memcpy(image.data() + 8, &body, 8);
    std::memcpy(image.data() + 16, kName, sizeof(kName));
    CUlibrary library = nullptr;
    CUkernel kernel = nullptr;
    ASSERT_EQ(cuLibraryLoadData(&library, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
              CUDA_SUCCESS);
    ASSERT_EQ(cuLibraryGetKernel(&kernel, library, kName), CUDA_SUCCESS);
    int64_t address = 8;
    void* params[] = {&address};
    ASSERT_EQ(cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), 1, 1, 1, 1, 1, 1, 0, stream,
                             params, nullptr),
              CUDA_SUCCESS);
    EXPECT_EQ(cuStreamSynchronize(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(cuLibraryUnload(library), CUDA_SUCCESS);
  }

#define FAKE_CUDA_TEST_MEMBER(name) decltype(&::name) name = nullptr;
  FAKE_CUDA_TEST_ENTRIES(FAKE_CUDA_TEST_MEMBER)
#undef FAKE_CUDA_TEST_MEMBER
  void* library_ = nullptr;
  std::optional<testing::FakeCudaDriver> fake_;
};

TEST_F(FakeCudaDriverTest, ObjectsDestroyedBeforeTheirContextLeaveNothingCounted) {
  CUcontext plain = nullptr;
  ASSERT_EQ(cuCtxCreate(&plain, nullptr, 0, 0), CUDA_SUCCESS);  // and makes it current
  CUstream stream = nullptr;
  CUevent event = nullptr;
  CUdeviceptr memory = 0;
  void* pinned = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&memory, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostAlloc(&pinned, 4096, 0), CUDA_SUCCESS);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kStream).live, 1);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(event), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(memory), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeHost(pinned), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy(plain), CUDA_SUCCESS);

  CUgreenCtx green = Green();
  CUcontext derived = nullptr;
  ASSERT_EQ(cuCtxFromGreenCtx(&derived, green), CUDA_SUCCESS);
  ASSERT_EQ(cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(derived), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&memory, 4096), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(memory), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(cuGreenCtxDestroy(green), CUDA_SUCCESS);

  EXPECT_EQ(fake_->misuses(), 0);
  std::string report;
  EXPECT_EQ(fake_->Leaks(&report), 0) << report;
  EXPECT_EQ(fake_->tally(FakeCudaKind::kContext).created, 1);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kGreenContext).created, 1);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kStream).created, 2);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kDeviceMemory).created, 2);
  // Destroying twice is a misuse.
  EXPECT_EQ(cuEventDestroy(event), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(fake_->misuses(), 1);
}

TEST_F(FakeCudaDriverTest, WhatOutlivesItsContextIsCountedByHowCudaEndsIt) {
  // A plain context destroyed with one of each in it: cuCtxDestroy frees them, as CUDA does,
  // but they were forgotten.
  CUcontext plain = nullptr;
  ASSERT_EQ(cuCtxCreate(&plain, nullptr, 0, 0), CUDA_SUCCESS);
  CUstream stream = nullptr;
  CUevent event = nullptr;
  CUdeviceptr memory = 0;
  void* pinned = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&event, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&memory, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostAlloc(&pinned, 4096, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy(plain), CUDA_SUCCESS);
  for (FakeCudaKind kind : {FakeCudaKind::kStream, FakeCudaKind::kEvent,
                            FakeCudaKind::kDeviceMemory, FakeCudaKind::kHostMemory}) {
    SCOPED_TRACE(testing::FakeCudaKindName(kind));
    const testing::FakeCudaTally t = fake_->tally(kind);
    EXPECT_EQ(t.created, 1);
    EXPECT_EQ(t.live, 0);
    EXPECT_EQ(t.freed_with_context, 1);
  }
  EXPECT_EQ(fake_->tally(FakeCudaKind::kContext).live, 0);

  // A green context frees none of them: its stream and memory outlive it, and destroying the
  // stream afterwards is too late (cuda.h), a misuse here.
  CUgreenCtx green = Green();
  CUcontext derived = nullptr;
  ASSERT_EQ(cuCtxFromGreenCtx(&derived, green), CUDA_SUCCESS);
  ASSERT_EQ(cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(derived), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&memory, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuGreenCtxDestroy(green), CUDA_SUCCESS);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kStream).outlived_green_context, 1);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kDeviceMemory).outlived_green_context, 1);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(fake_->misuses(), 1);

  // A context never destroyed is live, and so is what it holds.
  CUcontext kept = nullptr;
  ASSERT_EQ(cuCtxCreate(&kept, nullptr, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&event, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(nullptr), CUDA_SUCCESS);

  std::string report;
  EXPECT_EQ(fake_->OutlivedContexts(&report), 6) << report;
  EXPECT_EQ(fake_->Leaks(&report), 8) << report;
  EXPECT_THAT(report, HasSubstr("fake libcuda: leak: 1 stream from cuGreenCtxStreamCreate "
                                "outlived their green context"));
  EXPECT_THAT(report, HasSubstr("fake libcuda: leak: 1 pinned host allocation from "
                                "cuMemHostAlloc still alive when cuCtxDestroy destroyed"));
  EXPECT_THAT(report, HasSubstr("fake libcuda: leak: 1 context from cuCtxCreate still alive"));
  EXPECT_THAT(report, HasSubstr("fake libcuda: leak: 1 event from cuEventCreate still alive"));
  EXPECT_EQ(cuCtxDestroy(kept), CUDA_SUCCESS);
}

TEST_F(FakeCudaDriverTest, WhatAFaultedContextHeldIsFreedWithItExceptGreenStreams) {
  CUcontext plain = nullptr;
  ASSERT_EQ(cuCtxCreate(&plain, nullptr, 0, 0), CUDA_SUCCESS);
  CUstream stream = nullptr;
  CUdeviceptr memory = 0;
  ASSERT_EQ(cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&memory, 4096), CUDA_SUCCESS);
  Fault(stream);
  ASSERT_EQ(cuCtxDestroy(plain), CUDA_SUCCESS);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kStream).freed_after_fault, 1);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kDeviceMemory).freed_after_fault, 1);
  std::string report;
  EXPECT_EQ(fake_->Leaks(&report), 0) << report;
  EXPECT_THAT(report, HasSubstr("fake libcuda: note: 1 stream from cuStreamCreateWithPriority "
                                "freed with their faulted context"));

  // An illegal address is fatal to the process: no context can be created until a new one.
  CUcontext refused = nullptr;
  EXPECT_EQ(cuCtxCreate(&refused, nullptr, 0, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
  fake_->NewProcess();

  // A faulted green context's stream still had to be destroyed first.
  CUgreenCtx green = Green();
  CUcontext derived = nullptr;
  ASSERT_EQ(cuCtxFromGreenCtx(&derived, green), CUDA_SUCCESS);
  ASSERT_EQ(cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(derived), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&memory, 4096), CUDA_SUCCESS);
  Fault(stream);
  ASSERT_EQ(cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuGreenCtxDestroy(green), CUDA_SUCCESS);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kStream).outlived_green_context, 1);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kDeviceMemory).freed_after_fault, 2);
  EXPECT_EQ(fake_->Leaks(&report), 1) << report;
  EXPECT_EQ(fake_->misuses(), 0);
}

// Host registration as cuda.h describes it: a range pinned for the registering context,
// overlaps refused, the base pointer to unregister; copies counted by the host memory they
// use, and one that runs past a registered range a misuse.
TEST_F(FakeCudaDriverTest, HostRegistrationPinsARangeAndCopiesAreCountedByHostMemory) {
  CUcontext plain = nullptr;
  ASSERT_EQ(cuCtxCreate(&plain, nullptr, 0, 0), CUDA_SUCCESS);
  CUstream stream = nullptr;
  CUdeviceptr memory = 0;
  void* pinned = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&memory, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostAlloc(&pinned, 4096, 0), CUDA_SUCCESS);
  std::vector<char> host(3 * 4096, 7);
  char* range = host.data() + 4096;
  ASSERT_EQ(cuMemHostRegister(range, 4096, 0), CUDA_SUCCESS);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 1);
  // Overlapping a registered range, or cuMemHostAlloc's memory, is refused (not a misuse).
  EXPECT_EQ(cuMemHostRegister(range + 4095, 2, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister(host.data(), 4097, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister(pinned, 16, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(fake_->misuses(), 0);

  EXPECT_EQ(cuMemcpyHtoDAsync(memory, range, 4096, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyDtoHAsync(range + 100, memory, 200, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyHtoDAsync(memory, pinned, 4096, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyDtoHAsync(host.data(), memory, 4096, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  testing::FakeCudaHostCopies copies = fake_->host_copies();
  EXPECT_EQ(copies.direct_in.copies, 1);
  EXPECT_EQ(copies.direct_in.bytes, 4096);
  EXPECT_EQ(copies.direct_out.copies, 1);
  EXPECT_EQ(copies.direct_out.bytes, 200);
  EXPECT_EQ(copies.staging_in.copies, 1);
  EXPECT_EQ(copies.staging_out.copies, 0);
  EXPECT_EQ(copies.pageable_out.copies, 1);
  EXPECT_EQ(copies.pageable_in.copies, 0);

  // A host range that starts inside the registered range must end inside it.
  EXPECT_EQ(cuMemcpyHtoDAsync(memory, range + 4000, 200, stream), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fake_->misuses(), 1);
  // Unregistering takes the base pointer.
  EXPECT_EQ(cuMemHostUnregister(range + 1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(fake_->misuses(), 2);
  EXPECT_EQ(cuMemHostUnregister(range), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(range), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(fake_->misuses(), 3);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).live, 0);
  // The range is pageable again.
  EXPECT_EQ(cuMemcpyHtoDAsync(memory, range + 4000, 200, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(fake_->host_copies().pageable_in.copies, 1);

  // A range left registered goes with its context, like the rest: a leak for the tests.
  ASSERT_EQ(cuMemHostRegister(range, 4096, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(memory), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeHost(pinned), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy(plain), CUDA_SUCCESS);
  EXPECT_EQ(fake_->tally(FakeCudaKind::kHostRegistration).freed_with_context, 1);
  std::string report;
  EXPECT_EQ(fake_->Leaks(&report), 1) << report;
  EXPECT_THAT(report, HasSubstr("fake libcuda: leak: 1 host registration from cuMemHostRegister "
                                "still alive when cuCtxDestroy destroyed their context"));
  // Released: the range can be registered again.
  ASSERT_EQ(cuCtxCreate(&plain, nullptr, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostRegister(range, 4096, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(range), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy(plain), CUDA_SUCCESS);
  EXPECT_EQ(fake_->misuses(), 3);
}

}  // namespace
}  // namespace tessera
