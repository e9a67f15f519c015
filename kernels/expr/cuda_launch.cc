// The launch of a generated kernel (cuda_codegen.h): its parameter struct, filled from a plan
// with the geometry every backend shares (kernels/geometry.h), and its grid.
#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"

#include "kernels/expr/cuda_codegen.h"
#include "kernels/geometry.h"
#include "kernels/shape.h"

namespace tessera::kernels::expr {
namespace {

constexpr int kParamRank = static_cast<int>(kMaxRank);

absl::Status LaunchError(auto&&... parts) {
  return absl::InternalError(absl::StrCat("CUDA launch of a generated kernel: ", parts...));
}

// RowBlock of server/backend/cuda/launch.cc: a multiple of 32 up to 1024, by row length.
unsigned int ReduceBlock(int64_t count) {
  const int64_t threads = std::clamp<int64_t>((count + 31) / 32 * 32, 32, kCudaUserMaxReduceBlock);
  return static_cast<unsigned int>(
      std::min<int64_t>(threads, 256 * std::max<int64_t>(1, (count + 4095) / 4096)));
}

// Fills CudaParamFields' fields by name (indices within them: ranks are at most 8).
class ParamWriter {
 public:
  explicit ParamWriter(const Program& program) {
    int64_t offset = 0;
    for (const CudaParamField& f : CudaParamFields(program)) {
      offsets_.emplace_back(f.name, offset);
      offset += f.count;
    }
    values_.assign(static_cast<size_t>(offset), 0);
  }
  void Set(absl::string_view field, size_t index, int64_t value) {
    for (const auto& [name, offset] : offsets_) {
      if (name == field) {
        const size_t at = static_cast<size_t>(offset) + index;
        if (at < values_.size()) values_[at] = value;
        return;
      }
    }
  }
  std::vector<int64_t> Take() { return std::move(values_); }

 private:
  std::vector<std::pair<std::string, int64_t>> offsets_;
  std::vector<int64_t> values_;
};

}  // namespace

std::vector<CudaParamField> CudaParamFields(const Program& program) {
  const auto inputs = static_cast<int>(program.definition.inputs.size());
  const auto outputs = static_cast<int>(program.definition.outputs.size());
  const int params = std::max<int>(1, static_cast<int>(program.definition.params.size()));
  std::vector<CudaParamField> fields = {
      {"in", inputs, true}, {"out", outputs, true}, {"param", params, true}, {"n", 1, false}};
  if (!program.reduction.has_value()) {
    fields.insert(fields.end(), {{"rank", 1, false},
                                 {"contiguous", 1, false},
                                 {"shape", kParamRank, true},
                                 {"stride", inputs * kParamRank, true}});
  } else {
    fields.insert(fields.end(), {{"count", 1, false},
                                 {"warp_per_output", 1, false},
                                 {"kept_rank", 1, false},
                                 {"reduced_rank", 1, false},
                                 {"kept_shape", kParamRank, true},
                                 {"reduced_shape", kParamRank, true},
                                 {"kept_stride", inputs * kParamRank, true},
                                 {"reduced_stride", inputs * kParamRank, true}});
  }
  return fields;
}

absl::StatusOr<CudaLaunch> MakeCudaLaunch(const Program& program, const Plan& plan,
                                          const std::vector<uint64_t>& inputs,
                                          const std::vector<uint64_t>& outputs, int sms) {
  const Definition& d = program.definition;
  if (plan.inputs.size() != d.inputs.size() || plan.outputs.size() != d.outputs.size() ||
      inputs.size() != d.inputs.size() || outputs.size() != d.outputs.size()) {
    return LaunchError("a plan of ", plan.inputs.size(), " inputs and ", plan.outputs.size(),
                       " outputs for kernel ", d.name, " of ", d.inputs.size(), " and ",
                       d.outputs.size());
  }
  ParamWriter w(program);
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (plan.inputs[k].dtype != d.inputs[k].dtype) {
      return LaunchError("input ", k, " of kernel ", d.name, " is ",
                         DTypeName(plan.inputs[k].dtype));
    }
    w.Set("in", k, static_cast<int64_t>(inputs[k]));
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (plan.outputs[k].dtype != d.outputs[k].dtype) {
      return LaunchError("output ", k, " of kernel ", d.name, " is ",
                         DTypeName(plan.outputs[k].dtype));
    }
    w.Set("out", k, static_cast<int64_t>(outputs[k]));
  }
  for (size_t k = 0; k < d.params.size(); ++k) {
    const ScalarDef& s = d.params[k];
    if (!HasAttr(plan.attrs, s.name)) return LaunchError("the plan lacks parameter ", s.name);
    w.Set("param", k,
          s.kind == ScalarKind::kFloat ? std::bit_cast<int64_t>(AttrFloat(plan.attrs, s.name))
                                       : AttrInt(plan.attrs, s.name));
  }
  std::vector<Shape> shapes;
  for (const TensorMeta& m : plan.inputs) shapes.push_back(m.shape);
  CudaLaunch launch;
  sms = std::max(sms, 1);

  if (!program.reduction.has_value()) {
    const Shape& shape = plan.outputs[0].shape;
    const int64_t n = CheckedNumElements(shape);
    BroadcastGeometry g = MakeBroadcast(shape, shapes);
    if (g.shape.size() > kMaxRank) return LaunchError("rank ", g.shape.size(), " exceeds 8");
    bool contiguous = g.shape.size() == 1;
    for (size_t k = 0; k < shapes.size(); ++k) contiguous = contiguous && g.strides[k][0] == 1;
    w.Set("n", 0, n);
    w.Set("rank", 0, static_cast<int64_t>(g.shape.size()));
    w.Set("contiguous", 0, contiguous ? 1 : 0);
    for (size_t dim = 0; dim < g.shape.size(); ++dim) {
      w.Set("shape", dim, g.shape[dim]);
      for (size_t k = 0; k < shapes.size(); ++k) {
        w.Set("stride", k * kMaxRank + dim, g.strides[k][dim]);
      }
    }
    launch.params = w.Take();
    if (n == 0) return launch;
    launch.block = kCudaUserBlock;
    launch.grid = static_cast<unsigned int>(
        std::clamp<int64_t>((n + kCudaUserBlock - 1) / kCudaUserBlock, 1, int64_t{sms} * 16));
    return launch;
  }

  // A reduction: the inputs' broadcast shape, its dimensions split into kept and reduced
  // ones (size 1 dropped; neighbours of one kind merged where every input allows).
  Shape shape;
  for (const Shape& s : shapes) {
    absl::StatusOr<Shape> joined = BroadcastShapes(shape, s);
    if (!joined.ok())
      return LaunchError("inputs that do not broadcast: ", joined.status().message());
    shape = *std::move(joined);
  }
  const size_t rank = shape.size();
  std::vector<bool> reduced(rank, false);
  const std::vector<int64_t>& axes = AttrInts(plan.attrs, "axes");
  if (axes.empty()) reduced.assign(rank, true);
  for (int64_t a : axes) {
    absl::StatusOr<int> axis = NormalizeAxis(a, rank, "axes");
    if (!axis.ok()) return LaunchError(axis.status().message());
    reduced[static_cast<size_t>(*axis)] = true;
  }
  // Each input's element strides over `shape` (0 where it broadcasts).
  std::vector<std::vector<int64_t>> strides;
  for (const Shape& in : shapes) {
    std::vector<int64_t> s(rank, 0);
    int64_t stride = 1;
    for (size_t i = in.size(); i-- > 0;) {
      const size_t dim = rank - in.size() + i;
      s[dim] = in[i] == 1 ? 0 : stride;
      stride *= in[i];
    }
    strides.push_back(std::move(s));
  }
  struct Dims {
    std::vector<int64_t> shape;
    std::vector<std::vector<int64_t>> strides;  // per dimension, per input
  } kept, red;
  int last = -1;
  int64_t outputs_count = 1, count = 1;
  for (size_t dim = 0; dim < rank; ++dim) {
    if (shape[dim] == 1) continue;
    const int kind = reduced[dim] ? 1 : 0;
    Dims& dims = kind ? red : kept;
    (kind ? count : outputs_count) *= shape[dim];
    bool merge = kind == last;
    for (size_t k = 0; merge && k < strides.size(); ++k) {
      merge = dims.strides.back()[k] == strides[k][dim] * shape[dim];
    }
    std::vector<int64_t> at;
    for (const auto& s : strides) at.push_back(s[dim]);
    if (merge) {
      dims.shape.back() *= shape[dim];
      dims.strides.back() = at;
    } else {
      dims.shape.push_back(shape[dim]);
      dims.strides.push_back(at);
    }
    last = kind;
  }
  w.Set("n", 0, outputs_count);
  w.Set("count", 0, count);
  const bool warp_per_output = count <= kWarpReduceMax;
  w.Set("warp_per_output", 0, warp_per_output ? 1 : 0);
  w.Set("kept_rank", 0, static_cast<int64_t>(kept.shape.size()));
  w.Set("reduced_rank", 0, static_cast<int64_t>(red.shape.size()));
  auto fill = [&](const Dims& dims, absl::string_view shape_field, absl::string_view stride_field) {
    for (size_t dim = 0; dim < dims.shape.size(); ++dim) {
      w.Set(shape_field, dim, dims.shape[dim]);
      for (size_t k = 0; k < strides.size(); ++k) {
        w.Set(stride_field, k * kMaxRank + dim, dims.strides[dim][k]);
      }
    }
  };
  fill(kept, "kept_shape", "kept_stride");
  fill(red, "reduced_shape", "reduced_stride");
  launch.params = w.Take();
  if (outputs_count == 0) return launch;
  if (warp_per_output) {
    const int64_t warps = kCudaUserBlock / 32;
    launch.block = kCudaUserBlock;
    launch.grid = static_cast<unsigned int>(
        std::clamp<int64_t>((outputs_count + warps - 1) / warps, 1, int64_t{sms} * 32));
  } else {
    launch.block = ReduceBlock(count);
    launch.grid = static_cast<unsigned int>(std::min<int64_t>(outputs_count, int64_t{sms} * 32));
  }
  return launch;
}

}  // namespace tessera::kernels::expr
