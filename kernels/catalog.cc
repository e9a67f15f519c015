// The built-in kernel catalog: signatures, attributes and inference, one kernel per Op.
// Backends implement the same ops; nothing else in the system validates a launch.
#include "absl/strings/str_cat.h"

#include "kernels/reduced_axes.h"
#include "kernels/registry.h"

namespace tessera::kernels {
namespace {

using Metas = std::vector<TensorMeta>;
using Result = absl::StatusOr<Metas>;

const std::vector<DType> kFloat = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64};
const std::vector<DType> kSigned = {DType::kF32, DType::kF16, DType::kBF16,
                                    DType::kF64, DType::kI32, DType::kI64};
const std::vector<DType> kNumeric = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                                     DType::kI32, DType::kI64, DType::kU8};
const std::vector<DType> kAll(std::begin(kAllDTypes), std::end(kAllDTypes));

absl::Status Invalid(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

Result SameAsInput(const Metas& in, const Attrs&, const OutputHints&) { return Metas{in[0]}; }

// sum/mean/max/min: `out_dtype` maps the input dtype; `needs_identity` refuses empty axes.
InferFn Reduction(DType (*out_dtype)(DType), bool needs_identity) {
  return [out_dtype, needs_identity](const Metas& in, const Attrs& attrs,
                                     const OutputHints&) -> Result {
    absl::StatusOr<std::vector<int>> axes =
        ReducedAxes(AttrInts(attrs, "axes"), in[0].shape.size());
    if (!axes.ok()) return axes.status();
    if (needs_identity) {
      for (int a : *axes) {
        if (in[0].shape[a] == 0) {
          return Invalid("axis ", a, " of ", MetaString(in[0]),
                         " is empty and this reduction has no identity");
        }
      }
    }
    return Metas{
        {out_dtype(in[0].dtype), ReducedShape(in[0].shape, *axes, AttrBool(attrs, "keepdims"))}};
  };
}

DType Keep(DType d) { return d; }
DType SumType(DType d) { return IsFloating(d) ? d : DType::kI64; }

Result InferBinary(const Metas& in, const Attrs&, const OutputHints&) {
  if (in[0].dtype != in[1].dtype) {
    return Invalid("inputs a (", DTypeName(in[0].dtype), ") and b (", DTypeName(in[1].dtype),
                   ") must have the same dtype; cast one first");
  }
  absl::StatusOr<Shape> shape = BroadcastShapes(in[0].shape, in[1].shape);
  if (!shape.ok()) return shape.status();
  return Metas{{in[0].dtype, *shape}};
}

Result InferFill(const Metas&, const Attrs& attrs, const OutputHints& hints) {
  // A pointer to the hint, not a copy: copying a std::optional<TensorMeta> out of a ternary
  // made GCC 12 -O3 report its disengaged payload as maybe-uninitialized.
  const TensorMeta* hint = !hints.empty() && hints[0] ? &*hints[0] : nullptr;
  TensorMeta out;
  if (HasAttr(attrs, "dtype")) {
    std::optional<DType> d = DTypeFromName(AttrString(attrs, "dtype"));
    if (!d) return Invalid("attribute dtype \"", AttrString(attrs, "dtype"), "\" is unknown");
    out.dtype = *d;
  } else {
    out.dtype = hint ? hint->dtype : DType::kF32;
  }
  if (HasAttr(attrs, "shape")) {
    out.shape = AttrInts(attrs, "shape");
  } else if (hint) {
    out.shape = hint->shape;
  } else {
    return Invalid("give attribute shape, or an existing or specified output tensor");
  }
  return Metas{out};
}

Result InferCast(const Metas& in, const Attrs& attrs, const OutputHints&) {
  std::optional<DType> d = DTypeFromName(AttrString(attrs, "dtype"));
  if (!d) {
    return Invalid("attribute dtype \"", AttrString(attrs, "dtype"),
                   "\" is unknown; use f32, f16, bf16, f64, i32, i64, u8 or bool");
  }
  return Metas{{*d, in[0].shape}};
}

Result InferArgmax(const Metas& in, const Attrs& attrs, const OutputHints&) {
  const Shape& shape = in[0].shape;
  bool keepdims = AttrBool(attrs, "keepdims");
  if (shape.empty()) return Metas{{DType::kI64, {}}};  // a scalar is its own argmax: 0
  absl::StatusOr<int> axis = NormalizeAxis(AttrInt(attrs, "axis"), shape.size(), "axis");
  if (!axis.ok()) return axis.status();
  if (shape[*axis] == 0)
    return Invalid("argmax over empty axis ", *axis, " of ", MetaString(in[0]));
  return Metas{{DType::kI64, ReducedShape(shape, {*axis}, keepdims)}};
}

Result InferSoftmax(const Metas& in, const Attrs& attrs, const OutputHints&) {
  if (!in[0].shape.empty()) {
    absl::Status s = NormalizeAxis(AttrInt(attrs, "axis"), in[0].shape.size(), "axis").status();
    if (!s.ok()) return s;
  }
  return Metas{in[0]};
}

// layer_norm / rms_norm: optional weight (and bias) of shape [last dim], same dtype as x.
Result InferNorm(const Metas& in, const Attrs& attrs, const OutputHints&) {
  if (!(AttrFloat(attrs, "eps") > 0)) return Invalid("attribute eps must be > 0");
  int64_t last = in[0].shape.empty() ? 1 : in[0].shape.back();
  const char* names[] = {"x", "weight", "bias"};
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].dtype != in[0].dtype) {
      return Invalid(names[i], " has dtype ", DTypeName(in[i].dtype), "; it must match x (",
                     DTypeName(in[0].dtype), ")");
    }
    if (in[i].shape != Shape{last}) {
      return Invalid(names[i], " has shape ", ShapeString(in[i].shape), "; it must be [", last,
                     "] (the last axis of x)");
    }
  }
  return Metas{in[0]};
}

Result InferTranspose(const Metas& in, const Attrs& attrs, const OutputHints&) {
  const Shape& shape = in[0].shape;
  std::vector<int64_t> perm;
  if (HasAttr(attrs, "perm")) {
    perm = AttrInts(attrs, "perm");
  } else {
    for (size_t i = shape.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  }
  if (perm.size() != shape.size()) {
    return Invalid("perm has ", perm.size(), " entries; x has rank ", shape.size());
  }
  Shape out(shape.size());
  std::vector<bool> seen(shape.size(), false);
  for (size_t i = 0; i < perm.size(); ++i) {
    absl::StatusOr<int> axis = NormalizeAxis(perm[i], shape.size(), absl::StrCat("perm[", i, "]"));
    if (!axis.ok()) return axis.status();
    if (seen[*axis]) return Invalid("perm is not a permutation: axis ", *axis, " appears twice");
    seen[*axis] = true;
    out[i] = shape[*axis];
  }
  return Metas{{in[0].dtype, out}};
}

Result InferMatmul(const Metas& in, const Attrs& attrs, const OutputHints&) {
  const TensorMeta& a = in[0];
  const TensorMeta& b = in[1];
  if (a.dtype != b.dtype) {
    return Invalid("a (", DTypeName(a.dtype), ") and b (", DTypeName(b.dtype),
                   ") must have the same dtype");
  }
  if (a.shape.size() < 2 || b.shape.size() < 2) {
    return Invalid("a ", ShapeString(a.shape), " and b ", ShapeString(b.shape),
                   " must each have rank >= 2 ([..., rows, cols])");
  }
  bool ta = AttrBool(attrs, "transpose_a");
  bool tb = AttrBool(attrs, "transpose_b");
  size_t ra = a.shape.size();
  size_t rb = b.shape.size();
  int64_t m = ta ? a.shape[ra - 1] : a.shape[ra - 2];
  int64_t ka = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  int64_t kb = tb ? b.shape[rb - 1] : b.shape[rb - 2];
  int64_t n = tb ? b.shape[rb - 2] : b.shape[rb - 1];
  if (ka != kb) {
    return Invalid("inner dimensions differ: a gives K=", ka, ", b gives K=", kb, " (shapes ",
                   ShapeString(a.shape), ", ", ShapeString(b.shape), ", transpose_a=", ta,
                   ", transpose_b=", tb, ")");
  }
  Shape batch_a(a.shape.begin(), a.shape.end() - 2);
  Shape batch_b(b.shape.begin(), b.shape.end() - 2);
  absl::StatusOr<Shape> batch = BroadcastShapes(batch_a, batch_b);
  if (!batch.ok()) return Invalid("batch dimensions: ", batch.status().message());
  Shape out = *batch;
  out.push_back(m);
  out.push_back(n);
  return Metas{{a.dtype, out}};
}

ParamDef In(const char* name, const std::vector<DType>& dtypes, const char* rule,
            bool optional = false) {
  return ParamDef{name, dtypes, rule, optional};
}

KernelDef Unary(const char* name, Op op, const char* description,
                const std::vector<DType>& dtypes) {
  return KernelDef{.name = name,
                   .op = op,
                   .description = description,
                   .inputs = {In("x", dtypes, "any")},
                   .outputs = {In("y", dtypes, "same as x")},
                   .infer = SameAsInput};
}

KernelDef Binary(const char* name, Op op, const char* description,
                 const std::vector<DType>& dtypes) {
  return KernelDef{name,
                   op,
                   description,
                   {In("a", dtypes, "any"), In("b", dtypes, "broadcasts with a; same dtype")},
                   {In("y", dtypes, "NumPy broadcast of a and b")},
                   {},
                   InferBinary};
}

std::vector<AttrDef> ReductionAttrs() {
  return {{"axes", AttrType::kInts, std::vector<int64_t>{}, false,
           "axes to reduce, negative from the end; empty: all"},
          {"keepdims", AttrType::kBool, false, false, "keep reduced axes with size 1"}};
}

KernelDef Reduce(const char* name, Op op, const char* description, const std::vector<DType>& in,
                 const std::vector<DType>& out, InferFn infer) {
  return KernelDef{name,
                   op,
                   description,
                   {In("x", in, "any")},
                   {In("y", out, "x without (or with size-1) reduced axes")},
                   ReductionAttrs(),
                   std::move(infer)};
}

}  // namespace

std::vector<KernelDef> BuiltinKernels() {
  std::vector<KernelDef> k;
  k.push_back(
      {"fill",
       Op::kFill,
       "y = value everywhere",
       {},
       {In("y", kAll, "attribute shape, or the given output")},
       {{"value", AttrType::kFloat, 0.0, false, "the value (converted to the dtype)"},
        {"dtype", AttrType::kString, std::nullopt, false,
         "f32, f16, bf16, f64, i32, i64, u8 or bool; default: the output's, or f32"},
        {"shape", AttrType::kInts, std::nullopt, false, "dimensions; default: the given output's"}},
       InferFill});
  k.push_back({"copy",
               Op::kCopy,
               "y = x",
               {In("x", kAll, "any")},
               {In("y", kAll, "same as x")},
               {},
               SameAsInput});
  k.push_back({"cast",
               Op::kCast,
               "y = x converted to dtype (floats to ints truncate toward zero and saturate; "
               "NaN becomes 0; to bool: x != 0)",
               {In("x", kAll, "any")},
               {In("y", kAll, "shape of x")},
               {{"dtype", AttrType::kString, std::nullopt, true, "the target dtype"}},
               InferCast});
  k.push_back(Unary("neg", Op::kNeg, "y = -x", kSigned));
  k.push_back(Unary("abs", Op::kAbs, "y = |x|", kSigned));
  k.push_back(Unary("relu", Op::kRelu, "y = max(x, 0)", kSigned));
  k.push_back(Unary("exp", Op::kExp, "y = e^x", kFloat));
  k.push_back(Unary("log", Op::kLog, "y = ln x", kFloat));
  k.push_back(Unary("sqrt", Op::kSqrt, "y = sqrt(x)", kFloat));
  k.push_back(Unary("rsqrt", Op::kRsqrt, "y = 1 / sqrt(x)", kFloat));
  k.push_back(Unary("gelu", Op::kGelu, "y = x * Phi(x) (exact, erf form)", kFloat));
  k.push_back(Unary("sigmoid", Op::kSigmoid, "y = 1 / (1 + e^-x)", kFloat));
  k.push_back(Unary("tanh", Op::kTanh, "y = tanh(x)", kFloat));
  KernelDef scale = Unary("scale", Op::kScale, "y = alpha * x + beta", kFloat);
  scale.attrs = {{"alpha", AttrType::kFloat, 1.0, false, "multiplier"},
                 {"beta", AttrType::kFloat, 0.0, false, "offset"}};
  k.push_back(std::move(scale));
  k.push_back(Binary("add", Op::kAdd, "y = a + b", kNumeric));
  k.push_back(Binary("sub", Op::kSub, "y = a - b", kNumeric));
  k.push_back(Binary("mul", Op::kMul, "y = a * b", kNumeric));
  k.push_back(Binary("div", Op::kDiv, "y = a / b (integers: truncated; x / 0 = 0)", kNumeric));
  k.push_back(Binary("maximum", Op::kMaximum, "y = max(a, b) (NaN propagates)", kNumeric));
  k.push_back(Binary("minimum", Op::kMinimum, "y = min(a, b) (NaN propagates)", kNumeric));
  k.push_back(Binary("pow", Op::kPow, "y = a ^ b", kFloat));
  k.push_back(Reduce("sum", Op::kSum, "sum over axes (integers accumulate in i64)", kNumeric,
                     {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64},
                     Reduction(SumType, false)));
  k.push_back(Reduce("mean", Op::kMean, "mean over axes (empty: NaN)", kFloat, kFloat,
                     Reduction(Keep, false)));
  k.push_back(Reduce("max", Op::kMax, "maximum over axes (NaN propagates)", kNumeric, kNumeric,
                     Reduction(Keep, true)));
  k.push_back(Reduce("min", Op::kMin, "minimum over axes (NaN propagates)", kNumeric, kNumeric,
                     Reduction(Keep, true)));
  k.push_back({"argmax",
               Op::kArgmax,
               "index of the first maximum along axis (NaN counts as the maximum)",
               {In("x", kNumeric, "any")},
               {In("y", {DType::kI64}, "x without (or with size-1) axis")},
               {{"axis", AttrType::kInt, int64_t{-1}, false, "axis, negative from the end"},
                {"keepdims", AttrType::kBool, false, false, "keep the axis with size 1"}},
               InferArgmax});
  for (Op op : {Op::kSoftmax, Op::kLogSoftmax}) {
    const bool log_out = op == Op::kLogSoftmax;
    k.push_back({log_out ? "log_softmax" : "softmax",
                 op,
                 log_out ? "y = x - max - log(sum(exp(x - max))) along axis"
                         : "y = exp(x - max) / sum(exp(x - max)) along axis",
                 {In("x", kFloat, "any")},
                 {In("y", kFloat, "same as x")},
                 {{"axis", AttrType::kInt, int64_t{-1}, false, "axis, negative from the end"}},
                 InferSoftmax});
  }
  k.push_back({"layer_norm",
               Op::kLayerNorm,
               "y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis",
               {In("x", kFloat, "any"), In("weight", kFloat, "[last axis of x]", true),
                In("bias", kFloat, "[last axis of x]", true)},
               {In("y", kFloat, "same as x")},
               {{"eps", AttrType::kFloat, 1e-5, false, "added to the variance (> 0)"}},
               InferNorm});
  k.push_back({"rms_norm",
               Op::kRmsNorm,
               "y = x / sqrt(mean(x^2) + eps) * weight over the last axis",
               {In("x", kFloat, "any"), In("weight", kFloat, "[last axis of x]", true)},
               {In("y", kFloat, "same as x")},
               {{"eps", AttrType::kFloat, 1e-6, false, "added to the mean square (> 0)"}},
               InferNorm});
  k.push_back({"transpose",
               Op::kTranspose,
               "y = x with axes permuted: y.shape[i] = x.shape[perm[i]]",
               {In("x", kAll, "any")},
               {In("y", kAll, "x's dimensions permuted")},
               {{"perm", AttrType::kInts, std::nullopt, false, "permutation; default: reversed"}},
               InferTranspose});
  k.push_back({"matmul",
               Op::kMatmul,
               "y = alpha * op(a) @ op(b) + beta * y, batched over leading dimensions with "
               "broadcasting; beta scales the output tensor's existing contents",
               {In("a", kFloat, "[..., M, K] ([..., K, M] with transpose_a)"),
                In("b", kFloat, "[..., K, N] ([..., N, K] with transpose_b); same dtype")},
               {In("y", kFloat, "[broadcast batch..., M, N]")},
               {{"transpose_a", AttrType::kBool, false, false, "use a's last two axes swapped"},
                {"transpose_b", AttrType::kBool, false, false, "use b's last two axes swapped"},
                {"alpha", AttrType::kFloat, 1.0, false, "scales the product"},
                {"beta", AttrType::kFloat, 0.0, false, "scales the output's prior contents"}},
               InferMatmul});
  return k;
}

}  // namespace tessera::kernels
