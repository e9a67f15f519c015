#ifndef TESSERA_TESTS_FAKE_CUDA_DRIVER_DEVICE_H_
#define TESSERA_TESTS_FAKE_CUDA_DRIVER_DEVICE_H_

// What CUDA device code needs to compile as host C++ and run in the fake driver: force-included
// (-include) before each kernel source that the fake driver builds for the host
// (kernels/cuda/*.cu, tests/fake_cuda/driver/test_kernels.cu), which are not edited for it.
//
// - Qualifiers: __global__ marks an entry point (its own text section, which is how the build
//   lists the entry points: tests/fake_cuda/driver/list_kernels.cmake); __device__ and
//   __host__ vanish; __shared__ variables go to one section of the fake driver that the
//   runtime treats as the running block's shared memory (blocks run one at a time).
// - threadIdx, blockIdx, blockDim, gridDim: the running thread's, from the runtime.
// - __syncthreads, the warp intrinsics (__shfl*_sync, __ballot_sync, __any_sync, __all_sync,
//   __syncwarp, __activemask) and atomics, with CUDA's semantics: each device thread is a
//   fiber, and these are real barriers between the fibers of a block or warp
//   (tests/fake_cuda/driver/device_runtime.cc).
// - __half and __nv_bfloat16 are NVIDIA's own (cuda_fp16.h and cuda_bf16.h compile for the host,
//   with the same rounding as on the device).
//
// Every load and store these sources make is checked by the runtime (they are compiled with
// -fsanitize=kernel-address, whose checks call back into device_runtime.cc).

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <math.h>  // the float overloads of exp, log, ... in the global namespace, as on the device

#define __global__ __attribute__((used, noinline, section(".text.tessera_kernel")))
#define __device__
#define __host__
#define __shared__ static __attribute__((section("tessera_shared")))
#define __launch_bounds__(...)
// NVIDIA's host_defines.h (through cuda_fp16.h) redefines it the same way.
#define __forceinline__ inline __attribute__((always_inline))

#include <vector_types.h>

// The reinterpreting intrinsics (device_functions.h), which code without CUDA headers uses:
// the generated kernels of tenant-defined kernels (kernels/expr/cuda_codegen.cc).
inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
inline float __uint_as_float(unsigned int x) { return __builtin_bit_cast(float, x); }
inline unsigned int __float_as_uint(float x) { return __builtin_bit_cast(unsigned int, x); }
inline double __longlong_as_double(long long x) { return __builtin_bit_cast(double, x); }
inline long long __double_as_longlong(double x) { return __builtin_bit_cast(long long, x); }

extern "C" {
// By value: the kernels' reads of them are no memory accesses of theirs.
uint3 tessera_device_thread_idx();
uint3 tessera_device_block_idx();
dim3 tessera_device_block_dim();
dim3 tessera_device_grid_dim();
void tessera_device_syncthreads();
// One warp-wide exchange (kind: a TesseraWarpOp); returns what the calling lane receives.
unsigned long long tessera_device_warp(int kind, unsigned mask, unsigned long long value, int arg,
                                       int width);
// Checks an atomic's access (atomics are not instrumented as plain loads and stores).
void tessera_device_atomic(const void* address, unsigned long size);
}

enum TesseraWarpOp : int {
  kTesseraShfl = 0,
  kTesseraShflUp,
  kTesseraShflDown,
  kTesseraShflXor,
  kTesseraBallot,
  kTesseraAny,
  kTesseraAll,
  kTesseraSyncWarp,
};

#define threadIdx (tessera_device_thread_idx())
#define blockIdx (tessera_device_block_idx())
#define blockDim (tessera_device_block_dim())
#define gridDim (tessera_device_grid_dim())
constexpr int warpSize = 32;

inline void __syncthreads() { tessera_device_syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  tessera_device_warp(kTesseraSyncWarp, mask, 0, 0, 32);
}
inline unsigned __activemask() {  // every lane of the warp that has not exited
  return static_cast<unsigned>(tessera_device_warp(kTesseraBallot, 0, 1, 0, 32));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(tessera_device_warp(kTesseraBallot, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(tessera_device_warp(kTesseraAny, mask, predicate != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(tessera_device_warp(kTesseraAll, mask, predicate != 0, 0, 32));
}

namespace tessera_device {
template <typename T>
T Shuffle(int kind, unsigned mask, T value, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move up to 8 bytes");
  unsigned long long bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = tessera_device_warp(kind, mask, bits, arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace tessera_device

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = warpSize) {
  return tessera_device::Shuffle(kTesseraShfl, mask, value, src_lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  return tessera_device::Shuffle(kTesseraShflUp, mask, value, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  return tessera_device::Shuffle(kTesseraShflDown, mask, value, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
  return tessera_device::Shuffle(kTesseraShflXor, mask, value, lane_mask, width);
}

// Atomics: blocks of other launches may run on other host threads, so these are real ones.
template <typename T>
T atomicAdd(T* address, T value) {
  tessera_device_atomic(address, sizeof(T));
  if constexpr (std::is_floating_point_v<T>) {
    T old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(address, &old, old + value, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return old;
  } else {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
  }
}
template <typename T>
T atomicSub(T* address, T value) {
  tessera_device_atomic(address, sizeof(T));
  return __atomic_fetch_sub(address, value, __ATOMIC_RELAXED);
}
template <typename T>
T atomicExch(T* address, T value) {
  tessera_device_atomic(address, sizeof(T));
  return __atomic_exchange_n(address, value, __ATOMIC_RELAXED);
}
template <typename T>
T atomicCAS(T* address, T expected, T desired) {
  tessera_device_atomic(address, sizeof(T));
  __atomic_compare_exchange_n(address, &expected, desired, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  return expected;  // the old value either way
}
template <typename T>
T atomicMax(T* address, T value) {
  tessera_device_atomic(address, sizeof(T));
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (old < value && !__atomic_compare_exchange_n(address, &old, value, false, __ATOMIC_RELAXED,
                                                     __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
T atomicMin(T* address, T value) {
  tessera_device_atomic(address, sizeof(T));
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (value < old && !__atomic_compare_exchange_n(address, &old, value, false, __ATOMIC_RELAXED,
                                                     __ATOMIC_RELAXED)) {
  }
  return old;
}

#endif  // TESSERA_TESTS_FAKE_CUDA_DRIVER_DEVICE_H_
