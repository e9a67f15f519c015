#include "kernels/expr/user_kernel.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "kernels/expr/compile.h"
#include "kernels/reduced_axes.h"

namespace tessera::kernels::expr {
namespace {

using Metas = std::vector<TensorMeta>;

absl::Status Invalid(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

std::string RankRule(const OperandDef& operand) {
  return operand.rank < 0
             ? "any rank; broadcasts with the other inputs"
             : absl::StrCat("rank ", operand.rank, "; broadcasts with the other inputs");
}

// The inputs' common (broadcast) shape, after each input's rank is checked.
absl::StatusOr<Shape> ElementwiseShape(const Definition& d, const Metas& in) {
  Shape shape;
  for (size_t i = 0; i < in.size(); ++i) {
    const OperandDef& operand = d.inputs[i];
    if (operand.rank >= 0 && static_cast<int>(in[i].shape.size()) != operand.rank) {
      return Invalid("input ", operand.name, " must have rank ", operand.rank, "; got ",
                     MetaString(in[i]));
    }
    absl::StatusOr<Shape> joined = BroadcastShapes(shape, in[i].shape);
    if (!joined.ok()) {
      return Invalid("input ", operand.name, " ", MetaString(in[i]),
                     " does not broadcast with the inputs before it (", ShapeString(shape), ")");
    }
    shape = *std::move(joined);
  }
  return shape;
}

KernelDef SignatureOf(const Program& program) {
  const Definition& d = program.definition;
  KernelDef def;
  def.name = d.name;
  def.op = Op::kUser;
  def.description = program.reduction.has_value() ? "tenant-defined reduction (over attribute axes)"
                                                  : "tenant-defined element-wise kernel";
  for (const OperandDef& in : d.inputs) {
    def.inputs.push_back(ParamDef{in.name, {in.dtype}, RankRule(in), false});
  }
  for (const OperandDef& out : d.outputs) {
    def.outputs.push_back(ParamDef{out.name,
                                   {out.dtype},
                                   program.reduction.has_value()
                                       ? "the inputs' broadcast shape reduced over axes"
                                       : "the inputs' broadcast shape",
                                   false});
  }
  for (const ScalarDef& p : d.params) {
    AttrDef attr{.name = p.name,
                 .type = p.kind == ScalarKind::kInt ? AttrType::kInt : AttrType::kFloat,
                 .required = !p.default_value.has_value(),
                 .description = "parameter"};
    if (p.default_value.has_value()) {
      attr.default_value = p.kind == ScalarKind::kInt
                               ? AttrValue(static_cast<int64_t>(*p.default_value))
                               : AttrValue(*p.default_value);
    }
    def.attrs.push_back(std::move(attr));
  }
  const bool reduction = program.reduction.has_value();
  if (reduction) {
    def.attrs.push_back(
        AttrDef{.name = "axes",
                .type = AttrType::kInts,
                .default_value = AttrValue(std::vector<int64_t>{}),
                .description = "axes of the broadcast shape to reduce; empty: all"});
    def.attrs.push_back(AttrDef{.name = "keepdims",
                                .type = AttrType::kBool,
                                .default_value = AttrValue(false),
                                .description = "keep reduced axes with length 1"});
  }
  const bool arg = reduction && (program.reduction->combine == Combine::kArgmin ||
                                 program.reduction->combine == Combine::kArgmax);
  // The InferFn holds only the definition's data (a copy), not the program: the program owns
  // this KernelDef.
  def.infer = [d, reduction, arg](const Metas& in, const Attrs& attrs,
                                  const OutputHints&) -> absl::StatusOr<Metas> {
    absl::StatusOr<Shape> shape = ElementwiseShape(d, in);
    if (!shape.ok()) return shape.status();
    Shape out_shape = *shape;
    if (reduction) {
      absl::StatusOr<std::vector<int>> axes = ReducedAxes(AttrInts(attrs, "axes"), shape->size());
      if (!axes.ok()) return axes.status();
      if (arg) {
        for (int a : *axes) {
          if ((*shape)[a] == 0) {
            return Invalid("argmin/argmax over axis ", a, " of length 0 has no answer");
          }
        }
      }
      out_shape = ReducedShape(*shape, *axes, AttrBool(attrs, "keepdims"));
    }
    Metas out;
    for (const OperandDef& o : d.outputs) {
      if (o.rank >= 0 && static_cast<int>(out_shape.size()) != o.rank) {
        return Invalid("output ", o.name, " must have rank ", o.rank, " but would be ",
                       ShapeString(out_shape));
      }
      out.push_back(TensorMeta{o.dtype, out_shape});
    }
    return out;
  };
  return def;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const UserKernel>> MakeUserKernel(Definition definition) {
  if (Registry::Global().Find(definition.name) != nullptr) {
    return Invalid("kernel name ", definition.name,
                   " is the catalog's; choose another name (ListKernels lists the catalog)");
  }
  if (definition.inputs.empty()) {
    return Invalid("a kernel needs at least one input (its shape gives the outputs' shape)");
  }
  absl::StatusOr<Program> program = Compile(std::move(definition));
  if (!program.ok()) return program.status();
  auto kernel = std::make_shared<UserKernel>();
  kernel->program = *std::move(program);
  // The signature's InferFn copies the definition; nothing points into `kernel`.
  kernel->def = SignatureOf(kernel->program);
  absl::StatusOr<std::unique_ptr<const CpuProgram>> cpu = CpuProgram::Build(kernel->program);
  if (!cpu.ok()) return cpu.status();
  kernel->cpu = *std::move(cpu);
  return std::shared_ptr<const UserKernel>(std::move(kernel));
}

}  // namespace tessera::kernels::expr
