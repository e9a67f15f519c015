// transpose: a permuted copy, element-size generic.
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels_internal.h"

namespace tessera::kernels::cpu {
namespace {

template <typename Word>
void PermutedCopy(const Word* x, Word* y, const Shape& out_shape,
                  const std::vector<int64_t>& in_strides, int64_t begin, int64_t end) {
  const size_t rank = out_shape.size();
  std::vector<int64_t> index(rank);
  int64_t offset = 0;
  int64_t rest = begin;
  for (size_t d = rank; d-- > 0;) {
    index[d] = rest % out_shape[d];
    rest /= out_shape[d];
    offset += index[d] * in_strides[d];
  }
  const int64_t inner = out_shape[rank - 1];
  const int64_t inner_stride = in_strides[rank - 1];
  for (int64_t pos = begin; pos < end;) {
    int64_t n = std::min(inner - index[rank - 1], end - pos);
    for (int64_t j = 0; j < n; ++j) y[pos + j] = x[offset + j * inner_stride];
    pos += n;
    offset += n * inner_stride;
    index[rank - 1] += n;
    for (size_t d = rank - 1; d > 0 && index[d] == out_shape[d]; --d) {
      offset -= out_shape[d] * in_strides[d];
      index[d] = 0;
      ++index[d - 1];
      offset += in_strides[d - 1];
    }
  }
}

}  // namespace

void RunTranspose(const Plan& plan, const void* in, void* out, Parallel& parallel) {
  const Shape& in_shape = plan.inputs[0].shape;
  const int64_t n = CheckedNumElements(in_shape);
  const size_t size = DTypeSize(plan.inputs[0].dtype);
  if (n == 0) return;
  if (in_shape.empty()) {
    std::memcpy(out, in, size);
    return;
  }
  std::vector<int64_t> perm;
  if (HasAttr(plan.attrs, "perm")) {
    for (int64_t p : AttrInts(plan.attrs, "perm")) {
      perm.push_back(p < 0 ? p + static_cast<int64_t>(in_shape.size()) : p);
    }
  } else {
    for (size_t i = in_shape.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  }
  std::vector<int64_t> contiguous = ContiguousStrides(in_shape);
  std::vector<int64_t> strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) strides[i] = contiguous[perm[i]];
  const Shape& out_shape = plan.outputs[0].shape;
  parallel.For(n, 1 << 14, [&](int64_t b, int64_t e) {
    switch (size) {
      case 1:
        return PermutedCopy(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), out_shape,
                            strides, b, e);
      case 2:
        return PermutedCopy(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out),
                            out_shape, strides, b, e);
      case 4:
        return PermutedCopy(static_cast<const uint32_t*>(in), static_cast<uint32_t*>(out),
                            out_shape, strides, b, e);
      default:
        return PermutedCopy(static_cast<const uint64_t*>(in), static_cast<uint64_t*>(out),
                            out_shape, strides, b, e);
    }
  });
}

}  // namespace tessera::kernels::cpu
