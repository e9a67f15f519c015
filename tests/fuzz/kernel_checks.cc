#include "tests/fuzz/kernel_checks.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

#include "kernels/expr/compile.h"
#include "kernels/expr/cuda_codegen.h"
#include "kernels/expr/user_kernel.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

namespace expr = kernels::expr;

bool SameOperands(const std::vector<expr::OperandDef>& a, const std::vector<expr::OperandDef>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].rank != b[i].rank) return false;
  }
  return true;
}

bool SameDefinition(const expr::Definition& a, const expr::Definition& b) {
  if (a.name != b.name || a.body != b.body || !SameOperands(a.inputs, b.inputs) ||
      !SameOperands(a.outputs, b.outputs) || a.params.size() != b.params.size()) {
    return false;
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    const expr::ScalarDef& p = a.params[i];
    const expr::ScalarDef& q = b.params[i];
    if (p.name != q.name || p.kind != q.kind || p.default_value != q.default_value) return false;
  }
  return true;
}

// The text a store keeps must compile again after a restart, to the same program.
void CheckCanonicalText(const expr::Program& program) {
  const std::string text = expr::FormatDefinition(program.definition);
  absl::StatusOr<expr::Definition> parsed = expr::ParseSource(text);
  FUZZ_CHECK(parsed.ok(), "ParseSource refused FormatDefinition's text of an accepted kernel: ",
             parsed.status().ToString(), "\n--- text ---\n", text);
  FUZZ_CHECK(SameDefinition(*parsed, program.definition),
             "FormatDefinition/ParseSource round trip changed the definition\n--- text ---\n", text,
             "\n--- again ---\n", expr::FormatDefinition(*parsed));
  absl::StatusOr<expr::Program> again = expr::Compile(*std::move(parsed));
  FUZZ_CHECK(again.ok(), "the canonical text of an accepted kernel does not compile: ",
             again.status().ToString(), "\n--- text ---\n", text);
  FUZZ_CHECK(again->hash == program.hash, "the canonical text compiles to another hash");
  FUZZ_CHECK(again->nodes.size() == program.nodes.size(),
             "the canonical text compiles to another program");
}

// The inputs' metas for a launch: the given shapes, else [2, 3] (or its first `rank` dims).
std::vector<kernels::TensorMeta> InputMetas(const expr::Definition& d,
                                            const std::vector<kernels::Shape>& shapes) {
  std::vector<kernels::TensorMeta> metas;
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    kernels::TensorMeta meta{.dtype = d.inputs[i].dtype};
    if (i < shapes.size()) {
      meta.shape = shapes[i];
    } else {
      const int rank = d.inputs[i].rank < 0 ? 2 : d.inputs[i].rank;
      for (int r = 0; r < rank; ++r) meta.shape.push_back(r == rank - 1 ? 3 : 2);
    }
    metas.push_back(std::move(meta));
  }
  return metas;
}

void CheckLaunch(const std::shared_ptr<const expr::UserKernel>& kernel,
                 const std::vector<kernels::Shape>& shapes, kernels::Attrs attrs, uint64_t seed) {
  std::vector<kernels::TensorMeta> metas = InputMetas(kernel->program.definition, shapes);
  absl::StatusOr<kernels::Plan> plan =
      kernels::PrepareKernel(kernel->def, std::move(metas), std::move(attrs));
  if (!plan.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(plan.status()), plan.status().ToString());
    return;
  }
  plan->user = kernel;
  FUZZ_CHECK(plan->outputs.size() == kernel->program.definition.outputs.size(), "the plan has ",
             plan->outputs.size(), " outputs");
  for (const kernels::TensorMeta& out : plan->outputs) {
    absl::StatusOr<int64_t> bytes = kernels::ByteSize(out);
    FUZZ_CHECK(bytes.ok(), "an accepted launch has an invalid output: ", bytes.status().ToString());
  }
  // The CUDA launch for fake device addresses, on a device of 132 SMs.
  std::vector<uint64_t> in_addresses(plan->inputs.size(), 0x10000);
  std::vector<uint64_t> out_addresses(plan->outputs.size(), 0x20000);
  absl::StatusOr<expr::CudaLaunch> launch =
      expr::MakeCudaLaunch(kernel->program, *plan, in_addresses, out_addresses, 132);
  FUZZ_CHECK(launch.ok(),
             "MakeCudaLaunch refused an accepted launch: ", launch.status().ToString());
  RunPlanOnCpu(*plan, seed);
}

}  // namespace

bool CheckDefinition(expr::Definition definition, const std::vector<kernels::Shape>& input_shapes,
                     kernels::Attrs attrs, uint64_t seed) {
  absl::StatusOr<std::shared_ptr<const expr::UserKernel>> kernel =
      expr::MakeUserKernel(std::move(definition));
  if (!kernel.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(kernel.status()),
               "a definition was refused with a code other than INVALID_ARGUMENT: ",
               kernel.status().ToString());
    FUZZ_CHECK(kernel.status().message().size() <= 2048, "an error message of ",
               kernel.status().message().size(), " bytes");
    return false;
  }
  const expr::Program& program = (*kernel)->program;
  CheckCanonicalText(program);
  absl::StatusOr<expr::CudaKernelSource> cuda = expr::GenerateCudaKernel(program);
  FUZZ_CHECK(cuda.ok(),
             "GenerateCudaKernel refused an accepted program: ", cuda.status().ToString());
  CheckLaunch(*kernel, input_shapes, std::move(attrs), seed);
  return true;
}

}  // namespace tessera::fuzz
