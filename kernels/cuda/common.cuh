// Shared by the CUDA kernel files: element types, grid-stride loops, block reductions and
// the launch-parameter structs the host fills (server/backend/cuda/launch.cc). Every kernel
// is extern "C" so the backend finds it by name in the loaded library.
#ifndef TESSERA_KERNELS_CUDA_COMMON_CUH_
#define TESSERA_KERNELS_CUDA_COMMON_CUH_

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/params.h"

namespace tessera_cuda {

// Storage type S loaded into compute type C and stored back with one rounding.
template <typename S>
struct Elem {
  using C = S;
  static __device__ __forceinline__ C Load(S v) { return v; }
  static __device__ __forceinline__ S Store(C v) { return v; }
};
template <>
struct Elem<__half> {
  using C = float;
  static __device__ __forceinline__ float Load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half Store(float v) { return __float2half_rn(v); }
};
template <>
struct Elem<__nv_bfloat16> {
  using C = float;
  static __device__ __forceinline__ float Load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 Store(float v) { return __float2bfloat16_rn(v); }
};

template <typename T>
__device__ __forceinline__ bool IsNan(T v) {
  return v != v;
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GlobalStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Element offset of linear index `i` of `shape` walked with `strides` (rank <= kMaxRank).
__device__ __forceinline__ int64_t Offset(int64_t i, int rank, const int64_t* shape,
                                          const int64_t* strides) {
  int64_t offset = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t extent = shape[d];
    offset += (i % extent) * strides[d];
    i /= extent;
  }
  return offset;
}

// Block-wide reduction of one value per thread with `combine`; the result is valid in
// thread 0. blockDim.x must be a multiple of 32 and at most 1024.
template <typename T, typename F>
__device__ T BlockReduce(T value, F combine) {
  __shared__ unsigned char raw[32 * sizeof(T)];
  T* shared = reinterpret_cast<T*>(raw);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) {
    value = combine(value, __shfl_down_sync(0xffffffffu, value, offset));
  }
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  if (warp == 0) {
    value = lane < warps ? shared[lane] : shared[0];
    for (int offset = 16; offset > 0; offset /= 2) {
      T other = __shfl_down_sync(0xffffffffu, value, offset);
      if (lane + offset < warps) value = combine(value, other);
    }
  }
  return value;
}

// The block-wide result broadcast to every thread.
template <typename T, typename F>
__device__ T BlockAllReduce(T value, F combine) {
  __shared__ unsigned char raw[sizeof(T)];
  T* result = reinterpret_cast<T*>(raw);
  value = BlockReduce(value, combine);
  if (threadIdx.x == 0) *result = value;
  __syncthreads();
  value = *result;
  __syncthreads();
  return value;
}

}  // namespace tessera_cuda

#endif  // TESSERA_KERNELS_CUDA_COMMON_CUH_
