#ifndef TESSERA_TESTS_TESTING_HOST_TENSOR_H_
#define TESSERA_TESTS_TESTING_HOST_TENSOR_H_

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/dtype.h"
#include "kernels/shape.h"

namespace tessera::testing {

using kernels::DType;
using kernels::Shape;
using kernels::TensorMeta;

/// A contiguous host tensor with element access through double, for reference checks.
struct HostTensor {
  TensorMeta meta;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(DType dtype, Shape shape) : meta{dtype, std::move(shape)} {
    bytes.assign(static_cast<size_t>(size()) * kernels::DTypeSize(dtype), 0);
  }
  int64_t size() const { return kernels::CheckedNumElements(meta.shape); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }

  double Get(int64_t i) const {
    const uint8_t* p = bytes.data() + i * kernels::DTypeSize(meta.dtype);
    switch (meta.dtype) {
      case DType::kF32:
        return Load<float>(p);
      case DType::kF64:
        return Load<double>(p);
      case DType::kF16:
        return kernels::F16ToF32(Load<uint16_t>(p));
      case DType::kBF16:
        return kernels::BF16ToF32(Load<uint16_t>(p));
      case DType::kI32:
        return Load<int32_t>(p);
      case DType::kI64:
        return static_cast<double>(Load<int64_t>(p));
      case DType::kU8:
      case DType::kBool:
        return Load<uint8_t>(p);
    }
    return 0;
  }
  int64_t GetInt(int64_t i) const {
    const uint8_t* p = bytes.data() + i * kernels::DTypeSize(meta.dtype);
    if (meta.dtype == DType::kI64) return Load<int64_t>(p);
    if (meta.dtype == DType::kI32) return Load<int32_t>(p);
    return static_cast<int64_t>(Get(i));
  }
  /// Stores `v` rounded to the dtype (floats: nearest; ints: v must be representable).
  void Set(int64_t i, double v) {
    uint8_t* p = bytes.data() + i * kernels::DTypeSize(meta.dtype);
    switch (meta.dtype) {
      case DType::kF32:
        return StoreAs<float>(p, static_cast<float>(v));
      case DType::kF64:
        return StoreAs<double>(p, v);
      case DType::kF16:
        return StoreAs<uint16_t>(p, kernels::F64ToF16(v));
      case DType::kBF16:
        return StoreAs<uint16_t>(p, kernels::F64ToBF16(v));
      case DType::kI32:
        return StoreAs<int32_t>(p, static_cast<int32_t>(v));
      case DType::kI64:
        return StoreAs<int64_t>(p, static_cast<int64_t>(v));
      case DType::kU8:
        return StoreAs<uint8_t>(p, static_cast<uint8_t>(v));
      case DType::kBool:
        return StoreAs<uint8_t>(p, v != 0 ? 1 : 0);
    }
  }

  /// Fills with random values suited to the dtype: floats in [lo, hi], ints small.
  void Randomize(std::mt19937& gen, double lo = -4, double hi = 4) {
    std::uniform_real_distribution<double> real(lo, hi);
    std::uniform_int_distribution<int> small(-50, 50);
    std::uniform_int_distribution<int> byte(0, 255);
    for (int64_t i = 0; i < size(); ++i) {
      if (kernels::IsFloating(meta.dtype)) {
        Set(i, real(gen));
      } else if (meta.dtype == DType::kBool) {
        Set(i, byte(gen) & 1);
      } else if (meta.dtype == DType::kU8) {
        Set(i, byte(gen));
      } else {
        Set(i, small(gen));
      }
    }
  }

 private:
  template <typename T>
  static T Load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  template <typename T>
  static void StoreAs(uint8_t* p, T v) {
    std::memcpy(p, &v, sizeof(T));
  }
};

/// Multi-index of a linear index in a row-major shape.
inline std::vector<int64_t> Unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = i % shape[d];
    i /= shape[d];
  }
  return index;
}

/// Linear index of the element a broadcast input contributes to output `index`.
inline int64_t BroadcastSource(const std::vector<int64_t>& out_index, const Shape& in) {
  int64_t linear = 0;
  size_t offset = out_index.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) {
    linear = linear * in[d] + (in[d] == 1 ? 0 : out_index[offset + d]);
  }
  return linear;
}

/// Runs chunks on several threads (fresh per call), to exercise concurrency in kernels.
class ThreadParallel final : public kernels::Parallel {
 public:
  explicit ThreadParallel(int threads) : threads_(threads) {}
  void For(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> body) override {
    if (n <= 0) return;
    std::atomic<int64_t> next{0};
    auto work = [&] {
      for (int64_t b; (b = next.fetch_add(grain)) < n;) body(b, std::min(n, b + grain));
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads_; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
  }
  int Concurrency() const override { return threads_; }

 private:
  int threads_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_HOST_TENSOR_H_
