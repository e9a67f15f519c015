// Test-only kernels for the fake driver's own tests (tests/fake_cuda/fake_cuda_driver_test.cc),
// built like kernels/cuda/*.cu: by nvcc into a fatbin that the tests load, and for the host into
// the fake driver. The first ones use barriers and warp intrinsics correctly and check what they
// return; the others each do one thing a GPU refuses or leaves undefined.
#include <cstdint>

// y[i] = block-wide reversal through shared memory, plus the warp's sum and ballot of lanes.
extern "C" __global__ void tessera_test_collectives(int* reversed, int* warp_sum, unsigned* odd) {
  __shared__ int slots[1024];
  const unsigned t = threadIdx.x;
  slots[t] = static_cast<int>(t);
  __syncthreads();
  reversed[blockIdx.x * blockDim.x + t] = slots[blockDim.x - 1 - t];
  int sum = static_cast<int>(t);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  warp_sum[blockIdx.x * blockDim.x + t] = sum;
  odd[blockIdx.x * blockDim.x + t] = __ballot_sync(0xffffffffu, t % 2 == 1);
}

// Writes y[n]: one element past the end of an n-element buffer.
extern "C" __global__ void tessera_test_store_past_end(float* y, int64_t n) {
  if (blockIdx.x == 0 && threadIdx.x == 0) y[n] = 1.0f;
}

// y[i] = x[i]: the tests pass an x of another context.
extern "C" __global__ void tessera_test_copy(const float* x, float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}

// Reads shared slots that only half of the block wrote.
extern "C" __global__ void tessera_test_shared_unwritten(float* y) {
  __shared__ float slots[64];
  if (threadIdx.x < 32) slots[threadIdx.x] = 1.0f;
  __syncthreads();
  y[threadIdx.x] = slots[threadIdx.x];
}

// A shuffle whose mask leaves out half of the lanes that call it.
extern "C" __global__ void tessera_test_shuffle_mask(int* y) {
  y[threadIdx.x] = __shfl_down_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 16);
}

// Half of each warp waits at __syncthreads while the other half waits at a shuffle that
// needs the first half: neither can go on.
extern "C" __global__ void tessera_test_divergent_barrier(int* y) {
  if (threadIdx.x % 32 < 16) {
    __syncthreads();
  } else {
    y[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1);
  }
}
