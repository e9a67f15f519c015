#include "kernels/geometry.h"

namespace tessera::kernels {

BroadcastGeometry MakeBroadcast(const Shape& out, const std::vector<Shape>& ins) {
  const size_t rank = out.size();
  BroadcastGeometry g;
  std::vector<std::vector<int64_t>> strides;
  for (const Shape& in : ins) {
    std::vector<int64_t> s(rank, 0);
    int64_t stride = 1;
    for (size_t i = in.size(); i-- > 0;) {
      size_t d = rank - in.size() + i;
      s[d] = in[i] == 1 && out[d] != 1 ? 0 : stride;
      stride *= in[i];
    }
    strides.push_back(std::move(s));
  }
  // Drop size-1 dimensions, then merge neighbours that every operand walks contiguously.
  g.strides.resize(ins.size());
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    bool merge = !g.shape.empty();
    for (size_t k = 0; merge && k < ins.size(); ++k) {
      merge = g.strides[k].back() == strides[k][d] * out[d];
    }
    if (merge) {
      g.shape.back() *= out[d];
      for (size_t k = 0; k < ins.size(); ++k) g.strides[k].back() = strides[k][d];
    } else {
      g.shape.push_back(out[d]);
      for (size_t k = 0; k < ins.size(); ++k) g.strides[k].push_back(strides[k][d]);
    }
  }
  if (g.shape.empty()) {  // a scalar result
    g.shape.push_back(1);
    for (auto& s : g.strides) s.push_back(0);
  }
  return g;
}

ReduceGeometry MakeReduceGeometry(const Shape& shape, const std::vector<bool>& reduced) {
  ReduceGeometry g;
  std::vector<int64_t> strides = ContiguousStrides(shape);
  int last_kind = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    int kind = reduced[d] ? 1 : 0;
    auto& s = kind ? g.reduced_shape : g.kept_shape;
    auto& st = kind ? g.reduced_strides : g.kept_strides;
    if (kind == last_kind) {  // contiguous with the previous dimension of the same kind
      s.back() *= shape[d];
      st.back() = strides[d];
    } else {
      s.push_back(shape[d]);
      st.push_back(strides[d]);
    }
    last_kind = kind;
  }
  for (int64_t d : g.kept_shape) g.kept_count *= d;
  for (int64_t d : g.reduced_shape) g.reduced_count *= d;
  return g;
}

std::vector<bool> ReducedDims(const Plan& plan) {
  const Shape& shape = plan.inputs[0].shape;
  std::vector<bool> reduced(shape.size(), false);
  const std::vector<int64_t>& axes = AttrInts(plan.attrs, "axes");
  if (axes.empty()) {
    reduced.assign(shape.size(), true);
  } else {
    for (int64_t a : axes) reduced[a < 0 ? a + static_cast<int64_t>(shape.size()) : a] = true;
  }
  return reduced;
}

AxisGeometry AroundAxis(const Shape& shape, int axis) {
  AxisGeometry g;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    (d < axis ? g.outer : d == axis ? g.length : g.inner) *= shape[d];
  }
  return g;
}

int AxisOf(const Plan& plan) {
  int64_t axis = AttrInt(plan.attrs, "axis");
  int64_t rank = static_cast<int64_t>(plan.inputs[0].shape.size());
  return rank == 0 ? 0 : static_cast<int>(axis < 0 ? axis + rank : axis);
}

MatmulGeometry MakeMatmulGeometry(const Plan& plan) {
  MatmulGeometry g;
  const Shape& a = plan.inputs[0].shape;
  const Shape& b = plan.inputs[1].shape;
  const Shape& y = plan.outputs[0].shape;
  g.ta = AttrBool(plan.attrs, "transpose_a");
  g.tb = AttrBool(plan.attrs, "transpose_b");
  g.m = y[y.size() - 2];
  g.n = y[y.size() - 1];
  g.k = g.ta ? a[a.size() - 2] : a[a.size() - 1];
  g.lda = a[a.size() - 1];
  g.ldb = b[b.size() - 1];
  g.batch.assign(y.begin(), y.end() - 2);
  Shape a_batch(a.begin(), a.end() - 2);
  Shape b_batch(b.begin(), b.end() - 2);
  const int64_t a_matrix = a[a.size() - 2] * a[a.size() - 1];
  const int64_t b_matrix = b[b.size() - 2] * b[b.size() - 1];
  const int64_t batches = CheckedNumElements(g.batch);
  g.a_offset.resize(batches);
  g.b_offset.resize(batches);
  // Offsets of each broadcast batch into a and b (stride 0 where a batch dim is 1).
  std::vector<int64_t> a_strides(g.batch.size(), 0), b_strides(g.batch.size(), 0);
  int64_t sa = a_matrix, sb = b_matrix;
  for (size_t i = a_batch.size(); i-- > 0;) {
    size_t d = g.batch.size() - a_batch.size() + i;
    a_strides[d] = a_batch[i] == 1 ? 0 : sa;
    sa *= a_batch[i];
  }
  for (size_t i = b_batch.size(); i-- > 0;) {
    size_t d = g.batch.size() - b_batch.size() + i;
    b_strides[d] = b_batch[i] == 1 ? 0 : sb;
    sb *= b_batch[i];
  }
  for (int64_t t = 0; t < batches; ++t) {
    int64_t rest = t, oa = 0, ob = 0;
    for (size_t d = g.batch.size(); d-- > 0;) {
      int64_t idx = rest % g.batch[d];
      rest /= g.batch[d];
      oa += idx * a_strides[d];
      ob += idx * b_strides[d];
    }
    g.a_offset[t] = oa;
    g.b_offset[t] = ob;
  }
  return g;
}

}  // namespace tessera::kernels
