#ifndef TESSERA_TESTS_FAKE_CUDA_USER_KERNEL_CORPUS_H_
#define TESSERA_TESTS_FAKE_CUDA_USER_KERNEL_CORPUS_H_

// Tenant-defined kernels for the CUDA tests: checked programs (kernels/expr/ast.h) built node by
// node, a generated corpus of them over every dtype, broadcasting and reduction axes, ready-made
// plans, and a reference evaluation of ast.h's semantics written here, independently of the
// code generator (kernels/expr/cuda_codegen.cc) and of the CPU backend's bytecode.
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/expr/ast.h"
#include "kernels/expr/user_kernel.h"
#include "kernels/registry.h"
#include "tests/testing/host_tensor.h"

namespace tessera::testing {

/// Builds a checked program the way the checker would: node types follow ast.h (arithmetic
/// in its operands' type, comparisons bool), casts are explicit nodes.
class ProgramBuilder {
 public:
  explicit ProgramBuilder(std::string name) { program_.definition.name = std::move(name); }

  /// Operands and parameters; each returns its index.
  int AddInput(const std::string& name, kernels::DType dtype, int rank = -1);
  int AddOutput(const std::string& name, kernels::DType dtype, int rank = -1);
  int AddParam(const std::string& name, kernels::expr::ScalarKind kind,
               std::optional<double> default_value = std::nullopt);

  /// Nodes; each returns its index.
  int32_t Input(int input);  // loaded in its compute type
  int32_t Param(int param, kernels::expr::Type type);
  int32_t Const(kernels::expr::Type type, double value);
  int32_t ConstInt(int64_t value);
  int32_t Cast(int32_t a, kernels::expr::Type type);  // a itself when of that type already
  int32_t Unary(kernels::expr::UnaryOp op, int32_t a);
  int32_t Binary(kernels::expr::BinaryOp op, int32_t a, int32_t b);
  int32_t Call(kernels::expr::Func f, int32_t a, int32_t b = -1);
  int32_t Where(int32_t condition, int32_t a, int32_t b);
  int32_t Reduced();  // of the reduction's result type (Reduce first)
  int32_t Count();

  /// The reduction (before Reduced()); `map` is its element expression.
  void Reduce(kernels::expr::Combine combine, int32_t map);
  void Result(int32_t node) { program_.results.push_back(node); }

  kernels::expr::Type TypeOf(int32_t node) const {
    return program_.nodes[static_cast<size_t>(node)].type;
  }
  /// The program, with its hash: SHA-256 of its content.
  kernels::expr::Program Build();

 private:
  int32_t Add(kernels::expr::Node node);
  kernels::expr::Program program_;
};

/// A program with launch arguments: what a test runs.
struct UserCase {
  std::string description;
  std::shared_ptr<const kernels::expr::UserKernel> kernel;
  /// A plan of it (plan.user = kernel, plan.kernel = &kernel->def).
  kernels::Plan plan;
};

/// The kernel of `program` for plans (def: name, Op::kUser; no CPU form).
std::shared_ptr<const kernels::expr::UserKernel> UserKernelOf(kernels::expr::Program program);

/// A plan of `kernel` for inputs of `shapes` (the definition's dtypes) and `attrs` (defaults of
/// the parameters and of axes/keepdims filled in): outputs inferred as UserKernel documents.
kernels::Plan UserPlan(const std::shared_ptr<const kernels::expr::UserKernel>& kernel,
                       const std::vector<kernels::Shape>& shapes, kernels::Attrs attrs = {});

/// `elementwise` element-wise programs and `reductions` reductions, generated from `seed`
/// (deterministic), each with its plan.
std::vector<UserCase> Corpus(int elementwise, int reductions, uint32_t seed);

/// What a corpus means to cover, of one case: each input and output dtype, each node as its
/// kind, operator and type, the reduction's combine and accumulator, broadcast inputs, empty
/// outputs.
std::set<std::string> Features(const UserCase& c);

/// A fixed slice of `cases` that holds every feature of the whole: every `stride`-th case, then
/// greedily the case that holds the most features none taken so far has (the first of equals),
/// until every feature is held.
std::vector<UserCase> RepresentativeSlice(const std::vector<UserCase>& cases, int stride);

/// Random inputs for a case: values around the interesting ranges of each dtype, with
/// extremes (NaN, infinities, integer limits) mixed in.
std::vector<HostTensor> CaseInputs(const kernels::Plan& plan, std::mt19937& rng);

/// The outputs of `plan` evaluated with ast.h's semantics on the host.
std::vector<HostTensor> Reference(const kernels::Plan& plan, const std::vector<HostTensor>& inputs);

/// "" when `got` agrees with `expected` (bit for bit but NaN payloads, except float sums and
/// products, which may differ by the accumulated rounding of another summation order), else the
/// first difference.
std::string Compare(const kernels::Plan& plan, const std::vector<HostTensor>& inputs,
                    const std::vector<HostTensor>& expected, const std::vector<HostTensor>& got);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_FAKE_CUDA_USER_KERNEL_CORPUS_H_
