#ifndef TESSERA_KERNELS_EXPR_AST_H_
#define TESSERA_KERNELS_EXPR_AST_H_

// Tenant-defined kernels: the definition a tenant sends (a signature and a body in a small
// expression language, docs/kernels.md) and the checked, typed program every backend runs
// (the CPU backend as bytecode, the CUDA backend as generated CUDA C++ compiled by NVRTC).
//
// Safe by construction: an expression names whole operands, never an index, so the only
// memory a kernel touches is the elements of its own inputs and outputs, addressed by the
// server's geometry code (kernels/geometry.h). Every operation is total: integer division
// and remainder by zero give 0, integer overflow wraps (two's complement), floating point
// follows IEEE 754 (inf, NaN), casts of NaN or out-of-range floats to integers give 0 or
// the saturated bound (see kernels/expr/semantics.h). A program has no loop and no call, so
// its cost is bounded by its node count per element.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace tessera::kernels::expr {

// ---- What a tenant sends ----------------------------------------------------------------

/// A tensor operand of a definition.
struct OperandDef {
  std::string name;
  DType dtype = DType::kF32;
  /// Required rank, or -1 for any rank (elementwise inputs broadcast, numpy rules).
  int rank = -1;
};

/// The type of a scalar parameter (a launch attribute of the kernel).
enum class ScalarKind : uint8_t { kFloat, kInt };

struct ScalarDef {
  std::string name;
  ScalarKind kind = ScalarKind::kFloat;
  /// Used when the launch omits it; nullopt: the launch must give it.
  std::optional<double> default_value;
};

/// A kernel definition as sent by a tenant. `body` holds statements, one per line or
/// separated by ';':
///   let NAME = EXPR          a local value (used by later statements)
///   OUTPUT = EXPR            each output assigned exactly once, after every `let`
/// For a reduction kernel (one output), the output's expression contains exactly one call of
/// sum / prod / min / max / argmin / argmax, whose argument is the map expression and whose
/// surroundings are the post-expression (which may use `count`, the number of reduced
/// elements, and parameters, but not inputs).
struct Definition {
  std::string name;
  std::vector<OperandDef> inputs;
  std::vector<OperandDef> outputs;
  std::vector<ScalarDef> params;
  std::string body;
};

// ---- The checked program ------------------------------------------------------------------

/// Compute types. f16/bf16/f32 inputs load as kF32, f64 as kF64, i32/i64/u8 as kI64, bool as
/// kBool; a value is converted to the output's dtype when stored (f16/bf16 rounded to
/// nearest even).
enum class Type : uint8_t { kBool, kI64, kF32, kF64 };

/// The compute type an operand of `dtype` loads as (and the type its stores convert from).
constexpr Type ComputeType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return Type::kF32;
    case DType::kF64:
      return Type::kF64;
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      return Type::kI64;
    case DType::kBool:
      break;
  }
  return Type::kBool;
}

enum class NodeKind : uint8_t {
  kInput,    // `index`: input operand, loaded at the current element (broadcast)
  kParam,    // `index`: scalar parameter
  kConst,    // `i` for kBool/kI64, `f` for kF32/kF64
  kUnary,    // `op` (UnaryOp), args[0]
  kBinary,   // `op` (BinaryOp), args[0], args[1]
  kCall,     // `op` (Func), 1 or 2 args
  kWhere,    // args: condition (kBool), then, else
  kCast,     // args[0] converted to `type`
  kReduced,  // reduction post-expression only: the combined value
  kCount,    // reduction post-expression only: elements reduced (kI64)
};

/// kBitNot: `~`, on kI64 only.
enum class UnaryOp : uint8_t { kNeg, kNot, kBitNot };

/// Arithmetic on kI64/kF32/kF64 (both sides already of `type`, casts inserted by the
/// checker); comparisons give kBool from two operands of one type; kAnd/kOr on kBool.
/// kMod: C's truncated remainder for integers, fmod for floats. The bit operations kBitAnd ..
/// kShr are on kI64 only; shifts are total (semantics.h: a count outside 0..63 shifts every
/// bit out).
enum class BinaryOp : uint8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMod,
  kLt,
  kLe,
  kGt,
  kGe,
  kEq,
  kNe,
  kAnd,
  kOr,
  kBitAnd,
  kBitOr,
  kBitXor,
  kShl,
  kShr,
};

/// The math functions (docs/kernels.md, "Functions"); FuncArity says which take two arguments.
/// All on floats except kAbs, kMaximum, kMinimum, which also take kI64. The predicates kIsnan,
/// kIsinf, kIsfinite take a float and give kBool (IsPredicate); every other call has its
/// arguments' type.
enum class Func : uint8_t {
  kAbs,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kRelu,
  kGelu,
  kSigmoid,
  kTanh,
  kPow,
  kMaximum,
  kMinimum,
  kSin,
  kCos,
  kTan,
  kArcsin,
  kArccos,
  kArctan,
  kSinh,
  kCosh,
  kArcsinh,
  kArccosh,
  kArctanh,
  kLog10,
  kLog2,
  kLog1p,
  kExp2,
  kExpm1,
  kCbrt,
  kCeil,
  kFloor,
  kTrunc,
  kRound,  // half to even (numpy's rint)
  kIsnan,
  kIsinf,
  kIsfinite,
  kArctan2,  // arctan2(y, x)
  kHypot,
  kCopysign,
};

/// The last Func value.
inline constexpr Func kLastFunc = Func::kCopysign;

/// How many arguments `f` takes: 1 or 2.
constexpr int FuncArity(Func f) {
  switch (f) {
    case Func::kPow:
    case Func::kMaximum:
    case Func::kMinimum:
    case Func::kArctan2:
    case Func::kHypot:
    case Func::kCopysign:
      return 2;
    default:
      return 1;
  }
}

/// Whether `f` is a predicate: a float argument, a kBool result.
constexpr bool IsPredicate(Func f) {
  return f == Func::kIsnan || f == Func::kIsinf || f == Func::kIsfinite;
}

enum class Combine : uint8_t { kSum, kProd, kMin, kMax, kArgmin, kArgmax };

struct Node {
  NodeKind kind = NodeKind::kConst;
  Type type = Type::kF32;
  /// UnaryOp, BinaryOp or Func value for kUnary, kBinary, kCall.
  uint8_t op = 0;
  /// Operand or parameter index for kInput, kParam.
  int32_t index = 0;
  int64_t i = 0;
  double f = 0;
  /// Indices of earlier nodes.
  std::vector<int32_t> args;
  /// Where it came from in the body (1-based), for messages.
  int line = 0, column = 0;
};

struct Reduction {
  Combine combine = Combine::kSum;
  /// The node computing each element's value (depends on inputs, params, constants only).
  int32_t map = 0;
  /// The type the combine accumulates in: kF64 for float sums/products of f64 and kF32
  /// otherwise; kI64 for integers; kI64 indices for argmin/argmax (first index on ties,
  /// NaN compares as larger than everything for max and smaller for min).
  Type accumulate = Type::kF32;
};

/// A checked program: nodes in topological order (every arg precedes its user), one result
/// node per output (the value stored; for a reduction, the post-expression root, which is the
/// kReduced node itself when there is none). Immutable once built; shareable across threads.
/// Operands are already converted (the checker inserts kCast nodes): kUnary's arg, kBinary's
/// arithmetic args, kCall's args and kWhere's branches have the node's `type`; a comparison's
/// two args share one type. A result's type may differ from its output's compute type (the
/// store converts; docs/kernels.md, "Outputs"). For a reduction, nodes[0..map] are exactly the
/// map's subgraph, nodes[map + 1] is the kReduced node (no args), and the post-expression's
/// nodes follow it (never a kInput).
struct Program {
  Definition definition;
  std::vector<Node> nodes;
  std::vector<int32_t> results;
  std::optional<Reduction> reduction;
  /// Hex SHA-256 of the canonical definition; equal definitions have equal hashes (the CUDA
  /// image cache key, with the architecture and toolkit).
  std::string hash;
};

// ---- Limits (docs/kernels.md) -------------------------------------------------------------

inline constexpr size_t kMaxBodyBytes = 16 * 1024;
inline constexpr size_t kMaxNodes = 1024;
inline constexpr int kMaxNesting = 64;
inline constexpr size_t kMaxInputs = 16;
inline constexpr size_t kMaxOutputs = 8;
inline constexpr size_t kMaxParams = 16;
inline constexpr size_t kMaxNameBytes = 63;

}  // namespace tessera::kernels::expr

#endif  // TESSERA_KERNELS_EXPR_AST_H_
