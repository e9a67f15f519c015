#ifndef TESSERA_TESTS_FAKE_CUDA_DRIVER_API_H_
#define TESSERA_TESTS_FAKE_CUDA_DRIVER_API_H_

// The fake driver opened as the backend opens a driver, for the suites that call the driver
// API directly (fake_cuda_driver_test.cc, fake_cuda_kernels_test.cc).
#include <cstdlib>
#include <optional>
#include <type_traits>

#include <cuda.h>
#include <dlfcn.h>

#include "gtest/gtest.h"

#include "tests/fake_cuda/driver/fake_cuda.h"

namespace tessera::testing {

using GetProcAddress = decltype(&::cuGetProcAddress);

/// dlopens libcuda.so.1 with no MPS daemon to find and checks that it is the fake: its
/// handle goes to `*library` (for dlclose), the fake's controls to `*fake` and its
/// cuGetProcAddress to `*get_proc`. Fails the test otherwise (ASSERT_NO_FATAL_FAILURE).
inline void OpenFakeDriver(void** library, std::optional<FakeCudaDriver>* fake,
                           GetProcAddress* get_proc) {
  setenv("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/tessera-no-mps", 1);
  *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(*library, nullptr) << dlerror();
  *fake = FakeCudaDriver::Loaded();
  ASSERT_TRUE(fake->has_value()) << "libcuda.so.1 is not the fake driver";
  *get_proc = reinterpret_cast<GetProcAddress>(dlsym(*library, "cuGetProcAddress_v2"));
  ASSERT_NE(*get_proc, nullptr);
}

/// The entry point `name` into `fn`, fetched through cuGetProcAddress as the backend fetches
/// its entry points. Fails the test when the driver has none.
template <typename Fn>
void FetchEntry(GetProcAddress get_proc, const char* name, Fn& fn) {
  void* p = nullptr;
  get_proc(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
  fn = reinterpret_cast<Fn>(p);
  ASSERT_NE(p, nullptr) << name;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_FAKE_CUDA_DRIVER_API_H_
