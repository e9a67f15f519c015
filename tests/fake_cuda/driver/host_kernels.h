#ifndef TESSERA_TESTS_FAKE_CUDA_DRIVER_HOST_KERNELS_H_
#define TESSERA_TESTS_FAKE_CUDA_DRIVER_HOST_KERNELS_H_

// The kernels the fake driver runs: the CUDA sources compiled for the host into
// libtessera_host_kernels.so (the build includes each .cu in a generated file that ends with its
// entry points, listed from the source by tests/fake_cuda/driver/list_kernels.cmake), and how
// one launch of them runs (device_runtime.cc, in the fake driver). That library holds nothing
// but the kernels, so its writable data is exactly their __shared__ variables (device.h).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <vector_types.h>

namespace tessera::fake_cuda {

inline constexpr int kMaxKernelParams = 32;

/// Where a library of host kernels lies: its writable data (exactly its kernels' __shared__
/// variables: a launch's shared memory) and its read-only data (constants kernels may read).
struct HostImage {
  uintptr_t shared_lo = 0, shared_hi = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> readonly;
};

/// One __global__ function compiled for the host: how to call it with the driver's
/// `kernelParams` (one pointer per parameter, each to a copy of its value).
struct HostKernel {
  const char* name = nullptr;
  void (*fn)() = nullptr;
  void (*invoke)(void (*fn)(), void** params) = nullptr;
  int params = 0;
  std::array<uint32_t, kMaxKernelParams> sizes{};
  std::array<uint32_t, kMaxKernelParams> alignments{};
  /// The library it is in; null: libtessera_host_kernels.so.
  const HostImage* image = nullptr;
};

}  // namespace tessera::fake_cuda

/// Adds kernels to the fake driver's table: called as libtessera_host_kernels.so loads, from
/// the generated files.
extern "C" void tessera_fake_cuda_register_host_kernels(
    const tessera::fake_cuda::HostKernel* kernels, size_t count);

namespace tessera::fake_cuda {

void RegisterHostKernels(const HostKernel* kernels, size_t count);
/// The kernel named `name`, or null. Loads libtessera_host_kernels.so (beside the fake driver)
/// the first time; `error` says why none could be loaded.
const HostKernel* FindHostKernel(std::string_view name, std::string* error);

/// The kernels of a module built by the fake's kernel compiler (fake_kernel_compiler.cc, a
/// shared object with a TesseraFakeHostEntry table, host_module.h), loaded once per path and
/// never unloaded; null with `*error` saying why when it cannot be loaded. Thread-safe.
const std::vector<HostKernel>* LoadHostModule(const std::string& path, std::string* error);

/// Device memory as a launch sees it: every allocation of every context, sorted by base.
struct DeviceRange {
  uintptr_t base = 0;
  uint64_t requested = 0;  // the bytes the caller may touch
  uint64_t extent = 0;     // the bytes reserved, guard zone included: [base, base + extent)
  const void* context = nullptr;
};

/// Runs `kernel` over `grid` × `block` with its parameters (copied), in `context`, checking
/// every load and store against `memory`. CUDA_SUCCESS (0), or the CUresult a GPU would give
/// (700 illegal address, 716 misaligned address, 719 launch failed) with what happened,
/// naming the kernel, block, thread and address, in `*message`. One launch runs at a time in
/// the process.
int RunHostKernel(const HostKernel& kernel, dim3 grid, dim3 block, void** params,
                  const std::vector<DeviceRange>& memory, const void* context,
                  std::string* message);

template <typename... A, size_t... I>
__attribute__((no_sanitize_address)) void InvokeWith(void (*fn)(A...), void** params,
                                                     std::index_sequence<I...>) {
  fn(*static_cast<std::remove_cv_t<A>*>(params[I])...);
}

template <typename... A>
__attribute__((no_sanitize_address)) void Invoke(void (*fn)(), void** params) {
  InvokeWith(reinterpret_cast<void (*)(A...)>(fn), params, std::index_sequence_for<A...>{});
}

template <typename... A>
HostKernel Describe(const char* name, void (*fn)(A...)) {
  static_assert(sizeof...(A) <= kMaxKernelParams, "too many kernel parameters");
  HostKernel k;
  k.name = name;
  k.fn = reinterpret_cast<void (*)()>(fn);
  k.invoke = &Invoke<A...>;
  k.params = static_cast<int>(sizeof...(A));
  size_t i = 0;
  ((k.sizes[i] = sizeof(A), k.alignments[i] = alignof(A), ++i), ...);
  return k;
}

/// Registers the kernels of one generated file at load.
struct HostKernelRegistration {
  template <size_t N>
  explicit HostKernelRegistration(const std::array<HostKernel, N>& kernels) {
    tessera_fake_cuda_register_host_kernels(kernels.data(), N);
  }
};

}  // namespace tessera::fake_cuda

#endif  // TESSERA_TESTS_FAKE_CUDA_DRIVER_HOST_KERNELS_H_
