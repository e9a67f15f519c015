#ifndef TESSERA_KERNELS_REGISTRY_H_
#define TESSERA_KERNELS_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "kernels/dtype.h"
#include "kernels/shape.h"

namespace tessera::kernels {

enum class AttrType { kInt, kFloat, kBool, kString, kInts, kFloats };
absl::string_view AttrTypeName(AttrType type);

/// An attribute value; the alternative's index equals its AttrType.
using AttrValue =
    std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>>;
using Attrs = std::map<std::string, AttrValue, std::less<>>;

struct AttrDef {
  std::string name;
  AttrType type;
  /// Used when the attribute is absent; nullopt for optional attributes without a default
  /// (absent from the prepared Attrs) — see `required`.
  std::optional<AttrValue> default_value;
  bool required = false;
  std::string description;
};

struct ParamDef {
  std::string name;
  std::vector<DType> dtypes;
  /// The shape rule in words, for ListKernels.
  std::string shape_rule;
  bool optional = false;
};

/// What is known about each output before inference: the meta of an existing tensor or a
/// spec the caller gave (checked against the inferred one), or nothing.
using OutputHints = std::vector<std::optional<TensorMeta>>;

/// Checks shapes, dtypes across inputs and attribute values; returns the output metas.
/// Inputs are already checked for count and per-input dtype; attributes for names and
/// types, defaults filled.
using InferFn = std::function<absl::StatusOr<std::vector<TensorMeta>>(
    const std::vector<TensorMeta>& inputs, const Attrs& attrs, const OutputHints& hints)>;

/// The catalog's ops, one per kernel: what backends dispatch on. Each backend maps every op
/// to its implementation in one `switch` with no default, so a new op is one value here, one
/// catalog entry and one case per backend, and the compiler (-Wswitch) names any backend
/// that lacks its case.
enum class Op {
  kFill,
  kCopy,
  kCast,
  // Element-wise, one input.
  kNeg,
  kAbs,
  kRelu,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kGelu,
  kSigmoid,
  kTanh,
  kScale,
  // Element-wise, two inputs with broadcasting.
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMaximum,
  kMinimum,
  kPow,
  // Reductions and row-wise ops.
  kSum,
  kMean,
  kMax,
  kMin,
  kArgmax,
  kSoftmax,
  kLogSoftmax,
  kLayerNorm,
  kRmsNorm,
  // Layout and linear algebra.
  kTranspose,
  kMatmul,  // the last catalog op: kNumOps counts up to it
  // A tenant-defined kernel (kernels/expr): the plan carries its program (Plan::user).
  kUser,
};

/// Catalog ops are numbered 0..kNumOps-1; the catalog holds exactly one kernel per op.
inline constexpr int kNumOps = static_cast<int>(Op::kMatmul) + 1;

struct KernelDef {
  std::string name;
  /// What backends dispatch on; one kernel per op.
  Op op;
  std::string description;
  std::vector<ParamDef> inputs;
  std::vector<ParamDef> outputs;
  std::vector<AttrDef> attrs;
  InferFn infer;
};

namespace expr {
struct UserKernel;
}  // namespace expr

/// A validated launch: everything a backend needs, nothing left to check.
struct Plan {
  /// The catalog's definition, or the user kernel's (kept alive by `user`).
  const KernelDef* kernel = nullptr;
  std::vector<TensorMeta> inputs;
  std::vector<TensorMeta> outputs;
  /// Every attribute with a value, defaults filled.
  Attrs attrs;
  /// For Op::kUser: the tenant's kernel (program, CPU form); null for catalog kernels.
  std::shared_ptr<const expr::UserKernel> user;
};

/// Validates a launch of `kernel` as Registry::Prepare does (inputs, attributes, shape rules,
/// output hints); the plan points at `kernel`, which must outlive it.
absl::StatusOr<Plan> PrepareKernel(const KernelDef& kernel, std::vector<TensorMeta> inputs,
                                   Attrs attrs, const OutputHints& hints = {});

/// The kernel catalog: the single source of truth for names, signatures, shape and dtype
/// inference and attribute validation, used identically by every backend. Immutable and
/// thread-safe.
class Registry {
 public:
  /// The built-in catalog.
  static const Registry& Global();

  const KernelDef* Find(absl::string_view name) const;
  /// Ordered by name.
  const std::vector<KernelDef>& kernels() const { return kernels_; }

  /// Validates a launch completely: kernel name, input count and dtypes, attribute names,
  /// types and values, shape rules; infers the outputs and checks them against `hints`
  /// (at most one per output). Every error is INVALID_ARGUMENT naming the kernel, the
  /// operand or attribute, and the rule.
  absl::StatusOr<Plan> Prepare(absl::string_view name, std::vector<TensorMeta> inputs, Attrs attrs,
                               const OutputHints& hints = {}) const;

  explicit Registry(std::vector<KernelDef> kernels);

 private:
  std::vector<KernelDef> kernels_;
};

// Typed access to an attribute of a prepared Plan (present and of the declared type).
int64_t AttrInt(const Attrs& attrs, absl::string_view name);
double AttrFloat(const Attrs& attrs, absl::string_view name);
bool AttrBool(const Attrs& attrs, absl::string_view name);
const std::string& AttrString(const Attrs& attrs, absl::string_view name);
const std::vector<int64_t>& AttrInts(const Attrs& attrs, absl::string_view name);
bool HasAttr(const Attrs& attrs, absl::string_view name);

/// The catalog definitions (kernels/catalog.cc).
std::vector<KernelDef> BuiltinKernels();

}  // namespace tessera::kernels

#endif  // TESSERA_KERNELS_REGISTRY_H_
