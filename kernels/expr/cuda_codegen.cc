#include "kernels/expr/cuda_codegen.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

#include "kernels/expr/cuda_prelude.h"
#include "kernels/shape.h"

namespace tessera::kernels::expr {
namespace {

constexpr int kRank = static_cast<int>(kMaxRank);

absl::Status Internal(auto&&... parts) {
  return absl::InternalError(absl::StrCat("CUDA code generation: ", parts...));
}

// ---- Checking the program ---------------------------------------------------------------

bool IsFloat(Type t) { return t == Type::kF32 || t == Type::kF64; }
bool IsNumeric(Type t) { return t == Type::kI64 || IsFloat(t); }

const char* TypeName(Type t) {
  switch (t) {
    case Type::kBool:
      return "bool";
    case Type::kI64:
      return "tk_i64";
    case Type::kF32:
      return "float";
    case Type::kF64:
      return "double";
  }
  return "?";
}

// The storage type of `dtype` in generated code.
const char* StorageName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float";
    case DType::kF16:
    case DType::kBF16:
      return "tk_u16";
    case DType::kF64:
      return "double";
    case DType::kI32:
      return "int";
    case DType::kI64:
      return "tk_i64";
    case DType::kU8:
    case DType::kBool:
      return "tk_u8";
  }
  return "?";
}

// Arity and argument types of every node; everything the emitter relies on.
absl::Status CheckNode(const Program& program, size_t at, bool reduction) {
  const Node& n = program.nodes[at];
  const Definition& d = program.definition;
  const std::string where = absl::StrCat("node ", at, " (body line ", n.line, ":", n.column, ")");
  for (int32_t a : n.args) {
    if (a < 0 || static_cast<size_t>(a) >= at) {
      return Internal(where, " uses node ", a, ", which does not precede it");
    }
  }
  auto args = [&](size_t count) -> absl::Status {
    if (n.args.size() != count) {
      return Internal(where, " has ", n.args.size(), " arguments; expected ", count);
    }
    return absl::OkStatus();
  };
  auto arg_type = [&](size_t i) { return program.nodes[static_cast<size_t>(n.args[i])].type; };
  auto all_args = [&](Type t) {
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (arg_type(i) != t) return false;
    }
    return true;
  };
  auto mismatch = [&](absl::string_view what) {
    return Internal(where, ": ", what, " with operands of other types");
  };
  switch (n.kind) {
    case NodeKind::kInput:
      if (n.index < 0 || static_cast<size_t>(n.index) >= d.inputs.size()) {
        return Internal(where, " reads input ", n.index, " of ", d.inputs.size());
      }
      return args(0);
    case NodeKind::kParam:
      if (n.index < 0 || static_cast<size_t>(n.index) >= d.params.size()) {
        return Internal(where, " reads parameter ", n.index, " of ", d.params.size());
      }
      return args(0);
    case NodeKind::kConst:
      return args(0);
    case NodeKind::kReduced:
    case NodeKind::kCount:
      if (!reduction) return Internal(where, " is a reduction's value in an element-wise kernel");
      return args(0);
    case NodeKind::kCast:
      return args(1);
    case NodeKind::kWhere:
      if (absl::Status s = args(3); !s.ok()) return s;
      if (arg_type(0) != Type::kBool || arg_type(1) != n.type || arg_type(2) != n.type) {
        return mismatch("where");
      }
      return absl::OkStatus();
    case NodeKind::kUnary:
      if (absl::Status s = args(1); !s.ok()) return s;
      switch (static_cast<UnaryOp>(n.op)) {
        case UnaryOp::kNeg:
          if (!IsNumeric(n.type) || !all_args(n.type)) return mismatch("negation");
          return absl::OkStatus();
        case UnaryOp::kNot:
          if (n.type != Type::kBool || !all_args(Type::kBool)) return mismatch("not");
          return absl::OkStatus();
        case UnaryOp::kBitNot:
          if (n.type != Type::kI64 || !all_args(Type::kI64)) return mismatch("bitwise not");
          return absl::OkStatus();
      }
      return Internal(where, " has unary operator ", n.op);
    case NodeKind::kBinary: {
      if (absl::Status s = args(2); !s.ok()) return s;
      const auto op = static_cast<BinaryOp>(n.op);
      switch (op) {
        case BinaryOp::kAdd:
        case BinaryOp::kSub:
        case BinaryOp::kMul:
        case BinaryOp::kDiv:
        case BinaryOp::kMod:
          if (!IsNumeric(n.type) || !all_args(n.type)) return mismatch("arithmetic");
          return absl::OkStatus();
        case BinaryOp::kLt:
        case BinaryOp::kLe:
        case BinaryOp::kGt:
        case BinaryOp::kGe:
        case BinaryOp::kEq:
        case BinaryOp::kNe:
          if (n.type != Type::kBool || arg_type(0) != arg_type(1)) return mismatch("comparison");
          return absl::OkStatus();
        case BinaryOp::kAnd:
        case BinaryOp::kOr:
          if (n.type != Type::kBool || !all_args(Type::kBool)) return mismatch("and/or");
          return absl::OkStatus();
        case BinaryOp::kBitAnd:
        case BinaryOp::kBitOr:
        case BinaryOp::kBitXor:
        case BinaryOp::kShl:
        case BinaryOp::kShr:
          if (n.type != Type::kI64 || !all_args(Type::kI64)) return mismatch("a bit operation");
          return absl::OkStatus();
      }
      return Internal(where, " has binary operator ", n.op);
    }
    case NodeKind::kCall: {
      const auto f = static_cast<Func>(n.op);
      if (n.op > static_cast<uint8_t>(kLastFunc)) {
        return Internal(where, " calls function ", n.op);
      }
      if (absl::Status s = args(static_cast<size_t>(FuncArity(f))); !s.ok()) return s;
      if (IsPredicate(f)) {  // a float argument, a bool result
        if (n.type != Type::kBool || !IsFloat(arg_type(0))) return mismatch("a predicate");
        return absl::OkStatus();
      }
      const bool ints = f == Func::kAbs || f == Func::kMaximum || f == Func::kMinimum;
      if (!(IsFloat(n.type) || (ints && n.type == Type::kI64)) || !all_args(n.type)) {
        return mismatch("a function call");
      }
      return absl::OkStatus();
    }
  }
  return Internal(where, " has kind ", static_cast<int>(n.kind));
}

// Nodes `root` depends on (itself included).
std::vector<bool> Reachable(const Program& program, int32_t root) {
  std::vector<bool> used(program.nodes.size(), false);
  std::vector<int32_t> stack = {root};
  while (!stack.empty()) {
    const int32_t at = stack.back();
    stack.pop_back();
    if (used[static_cast<size_t>(at)]) continue;
    used[static_cast<size_t>(at)] = true;
    for (int32_t a : program.nodes[static_cast<size_t>(at)].args) stack.push_back(a);
  }
  return used;
}

absl::Status CheckProgram(const Program& program) {
  const Definition& d = program.definition;
  if (program.hash.empty() || program.hash.size() > 128 ||
      !std::all_of(program.hash.begin(), program.hash.end(),
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
    return Internal("the program hash \"", program.hash, "\" is not lowercase hex");
  }
  if (d.inputs.empty() || d.inputs.size() > kMaxInputs || d.outputs.empty() ||
      d.outputs.size() > kMaxOutputs || d.params.size() > kMaxParams) {
    return Internal(d.inputs.size(), " inputs, ", d.outputs.size(), " outputs and ",
                    d.params.size(), " parameters are outside the limits");
  }
  if (program.results.size() != d.outputs.size()) {
    return Internal(program.results.size(), " results for ", d.outputs.size(), " outputs");
  }
  const bool reduction = program.reduction.has_value();
  if (reduction && d.outputs.size() != 1) return Internal("a reduction with several outputs");
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    if (absl::Status s = CheckNode(program, i, reduction); !s.ok()) return s;
  }
  auto valid = [&](int32_t node) {
    return node >= 0 && static_cast<size_t>(node) < program.nodes.size();
  };
  for (int32_t r : program.results) {
    if (!valid(r)) return Internal("result node ", r, " does not exist");
  }
  if (!reduction) return absl::OkStatus();
  const Reduction& red = *program.reduction;
  if (!valid(red.map)) return Internal("the reduction's map node ", red.map, " does not exist");
  const std::vector<bool> map = Reachable(program, red.map);
  const std::vector<bool> post = Reachable(program, program.results[0]);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const NodeKind k = program.nodes[i].kind;
    if (map[i] && (k == NodeKind::kReduced || k == NodeKind::kCount)) {
      return Internal("the map expression uses the reduced value (node ", i, ")");
    }
    if (post[i] && k == NodeKind::kInput) {
      return Internal("the post-expression reads an input (node ", i, ")");
    }
  }
  const bool arg = red.combine == Combine::kArgmin || red.combine == Combine::kArgmax;
  if (arg ? red.accumulate != Type::kI64 : red.accumulate == Type::kBool) {
    return Internal("accumulating in ", TypeName(red.accumulate));
  }
  if (static_cast<uint8_t>(red.combine) > static_cast<uint8_t>(Combine::kArgmax)) {
    return Internal("combine operator ", static_cast<int>(red.combine));
  }
  return absl::OkStatus();
}

// ---- The emitter --------------------------------------------------------------------------

std::string F32Literal(double value) {
  const float f = static_cast<float>(value);
  char text[96];
  std::snprintf(text, sizeof(text), "__uint_as_float(0x%08" PRIx32 "u) /* %.9g */",
                std::bit_cast<uint32_t>(f), static_cast<double>(f));
  return text;
}

std::string F64Literal(double value) {
  char text[128];
  std::snprintf(text, sizeof(text), "__longlong_as_double((tk_i64)0x%016" PRIx64 "ull) /* %.17g */",
                std::bit_cast<uint64_t>(value), value);
  return text;
}

std::string I64Literal(int64_t value) {
  if (value == INT64_MIN) return "TK_I64_MIN";
  return value < 0 ? absl::StrCat("(", value, "LL)") : absl::StrCat(value, "LL");
}

// `expr` of compute type `from` as compute type `to` (ast.h's casts).
std::string Convert(const std::string& expr, Type from, Type to) {
  if (from == to) return expr;
  switch (to) {
    case Type::kBool:
      return absl::StrCat("(", expr, " != 0)");
    case Type::kI64:
      if (from == Type::kBool) return absl::StrCat("(tk_i64)(", expr, " ? 1 : 0)");
      return absl::StrCat("tk_f64_to_i64((double)(", expr, "))");
    case Type::kF32:
      if (from == Type::kBool) return absl::StrCat("(", expr, " ? 1.0f : 0.0f)");
      return absl::StrCat("(float)(", expr, ")");
    case Type::kF64:
      if (from == Type::kBool) return absl::StrCat("(", expr, " ? 1.0 : 0.0)");
      return absl::StrCat("(double)(", expr, ")");
  }
  return expr;
}

// `expr` of compute type `from` converted for storage as `dtype`.
std::string StoreValue(const std::string& expr, Type from, DType dtype) {
  if (from == Type::kBool) {
    switch (dtype) {
      case DType::kF32:
        return absl::StrCat("(", expr, " ? 1.0f : 0.0f)");
      case DType::kF64:
        return absl::StrCat("(", expr, " ? 1.0 : 0.0)");
      case DType::kF16:
        return absl::StrCat("(tk_u16)(", expr, " ? 0x3c00u : 0u)");
      case DType::kBF16:
        return absl::StrCat("(tk_u16)(", expr, " ? 0x3f80u : 0u)");
      case DType::kI32:
        return absl::StrCat("(int)(", expr, " ? 1 : 0)");
      case DType::kI64:
        return absl::StrCat("(tk_i64)(", expr, " ? 1 : 0)");
      case DType::kU8:
      case DType::kBool:
        return absl::StrCat("(tk_u8)(", expr, " ? 1 : 0)");
    }
  }
  if (dtype == DType::kBool) return absl::StrCat("(tk_u8)(", expr, " != 0 ? 1 : 0)");
  // Integers and f64 round through f64 to the narrow floats (catalog cast: one rounding of
  // the f64 value); f32 rounds directly.
  const std::string as_f64 = absl::StrCat("(double)(", expr, ")");
  switch (dtype) {
    case DType::kF32:
      return from == Type::kF32 ? expr : absl::StrCat("(float)(", expr, ")");
    case DType::kF64:
      return from == Type::kF64 ? expr : as_f64;
    case DType::kF16:
      return from == Type::kF32 ? absl::StrCat("tk_f32_to_f16(", expr, ")")
                                : absl::StrCat("tk_f32_to_f16(tk_round_odd_f32(", as_f64, "))");
    case DType::kBF16:
      return from == Type::kF32 ? absl::StrCat("tk_f32_to_bf16(", expr, ")")
                                : absl::StrCat("tk_f32_to_bf16(tk_round_odd_f32(", as_f64, "))");
    case DType::kI32:
      return from == Type::kI64 ? absl::StrCat("tk_i64_to_i32(", expr, ")")
                                : absl::StrCat("tk_f64_to_i32(", as_f64, ")");
    case DType::kI64:
      return from == Type::kI64 ? expr : absl::StrCat("tk_f64_to_i64(", as_f64, ")");
    case DType::kU8:
      return from == Type::kI64 ? absl::StrCat("tk_i64_to_u8(", expr, ")")
                                : absl::StrCat("tk_f64_to_u8(", as_f64, ")");
    case DType::kBool:
      break;
  }
  return expr;
}

// An element of input `k` (of `dtype`) at offset `offset`, in its load type.
std::string LoadValue(int k, DType dtype, const std::string& offset) {
  const std::string element = absl::StrCat("reinterpret_cast<const ", StorageName(dtype),
                                           "*>(p.in[", k, "])[", offset, "]");
  switch (dtype) {
    case DType::kF16:
      return absl::StrCat("tk_f16_to_f32(", element, ")");
    case DType::kBF16:
      return absl::StrCat("tk_bf16_to_f32(", element, ")");
    case DType::kI32:
    case DType::kU8:
      return absl::StrCat("(tk_i64)", element);
    case DType::kBool:
      return absl::StrCat("(", element, " != 0)");
    default:
      return element;
  }
}

class Emitter {
 public:
  explicit Emitter(const Program& program) : program_(program), d_(program.definition) {}

  std::string Name(int32_t node) const { return absl::StrCat("v", node); }

  // One statement per node of `used`, in order, declaring v<node>.
  void Nodes(const std::vector<bool>& used, const std::string& indent, std::string& out) const {
    for (size_t i = 0; i < program_.nodes.size(); ++i) {
      if (!used[i]) continue;
      const Node& n = program_.nodes[i];
      absl::StrAppend(&out, indent, "const ", TypeName(n.type), " ", Name(static_cast<int32_t>(i)),
                      " = ", Expression(n), ";\n");
    }
  }

 private:
  std::string Arg(const Node& n, size_t i) const { return Name(n.args[i]); }
  Type ArgType(const Node& n, size_t i) const {
    return program_.nodes[static_cast<size_t>(n.args[i])].type;
  }

  std::string Expression(const Node& n) const {
    switch (n.kind) {
      case NodeKind::kInput:
        return Convert(absl::StrCat("in", n.index),
                       ComputeType(d_.inputs[static_cast<size_t>(n.index)].dtype), n.type);
      case NodeKind::kParam: {
        const bool is_float = d_.params[static_cast<size_t>(n.index)].kind == ScalarKind::kFloat;
        const std::string raw = absl::StrCat("p.param[", n.index, "]");
        return is_float
                   ? Convert(absl::StrCat("__longlong_as_double(", raw, ")"), Type::kF64, n.type)
                   : Convert(raw, Type::kI64, n.type);
      }
      case NodeKind::kConst:
        switch (n.type) {
          case Type::kBool:
            return n.i != 0 ? "true" : "false";
          case Type::kI64:
            return I64Literal(n.i);
          case Type::kF32:
            return F32Literal(n.f);
          case Type::kF64:
            return F64Literal(n.f);
        }
        return "0";
      case NodeKind::kReduced: {
        const Reduction& r = *program_.reduction;
        const bool arg = r.combine == Combine::kArgmin || r.combine == Combine::kArgmax;
        return Convert(arg ? "index" : "acc", r.accumulate, n.type);
      }
      case NodeKind::kCount:
        return Convert("p.count", Type::kI64, n.type);
      case NodeKind::kCast:
        return Convert(Arg(n, 0), ArgType(n, 0), n.type);
      case NodeKind::kWhere:
        return absl::StrCat("(", Arg(n, 0), " ? ", Arg(n, 1), " : ", Arg(n, 2), ")");
      case NodeKind::kUnary:
        if (static_cast<UnaryOp>(n.op) == UnaryOp::kNot) return absl::StrCat("!", Arg(n, 0));
        if (static_cast<UnaryOp>(n.op) == UnaryOp::kBitNot) return absl::StrCat("~", Arg(n, 0));
        return n.type == Type::kI64 ? absl::StrCat("tk_neg_i64(", Arg(n, 0), ")")
                                    : absl::StrCat("-", Arg(n, 0));
      case NodeKind::kBinary:
        return Binary(n);
      case NodeKind::kCall:
        return Call(n);
    }
    return "0";
  }

  std::string Binary(const Node& n) const {
    const std::string a = Arg(n, 0), b = Arg(n, 1);
    auto infix = [&](const char* op) { return absl::StrCat("(", a, " ", op, " ", b, ")"); };
    auto call = [&](const char* f) { return absl::StrCat(f, "(", a, ", ", b, ")"); };
    const bool ints = n.type == Type::kI64;
    const bool f32 = n.type == Type::kF32;
    switch (static_cast<BinaryOp>(n.op)) {
      case BinaryOp::kAdd:
        return ints ? call("tk_add_i64") : infix("+");
      case BinaryOp::kSub:
        return ints ? call("tk_sub_i64") : infix("-");
      case BinaryOp::kMul:
        return ints ? call("tk_mul_i64") : infix("*");
      case BinaryOp::kDiv:
        return ints ? call("tk_div_i64") : infix("/");
      case BinaryOp::kMod:
        return ints ? call("tk_mod_i64") : call(f32 ? "fmodf" : "fmod");
      case BinaryOp::kLt:
        return infix("<");
      case BinaryOp::kLe:
        return infix("<=");
      case BinaryOp::kGt:
        return infix(">");
      case BinaryOp::kGe:
        return infix(">=");
      case BinaryOp::kEq:
        return infix("==");
      case BinaryOp::kNe:
        return infix("!=");
      case BinaryOp::kAnd:
        return infix("&&");
      case BinaryOp::kOr:
        return infix("||");
      case BinaryOp::kBitAnd:
        return infix("&");
      case BinaryOp::kBitOr:
        return infix("|");
      case BinaryOp::kBitXor:
        return infix("^");
      case BinaryOp::kShl:
        return call("tk_shl_i64");
      case BinaryOp::kShr:
        return call("tk_shr_i64");
    }
    return a;
  }

  std::string Call(const Node& n) const {
    const std::string a = Arg(n, 0);
    // A predicate's type is bool: its argument's type picks the function.
    const Type t = IsPredicate(static_cast<Func>(n.op)) ? ArgType(n, 0) : n.type;
    const char* suffix = t == Type::kF32 ? "_f32" : t == Type::kF64 ? "_f64" : "_i64";
    const bool f32 = t == Type::kF32;
    auto libm = [&](const char* name) { return absl::StrCat(name, f32 ? "f" : "", "(", a, ")"); };
    auto libm2 = [&](const char* name) {
      return absl::StrCat(name, f32 ? "f" : "", "(", a, ", ", Arg(n, 1), ")");
    };
    auto ours = [&](const char* name) { return absl::StrCat("tk_", name, suffix, "(", a, ")"); };
    auto ours2 = [&](const char* name) {
      return absl::StrCat("tk_", name, suffix, "(", a, ", ", Arg(n, 1), ")");
    };
    switch (static_cast<Func>(n.op)) {
      case Func::kAbs:
        return n.type == Type::kI64 ? ours("abs") : absl::StrCat(f32 ? "fabsf(" : "fabs(", a, ")");
      case Func::kExp:
        return libm("exp");
      case Func::kLog:
        return libm("log");
      case Func::kSqrt:
        return libm("sqrt");
      case Func::kRsqrt:
        return ours("rsqrt");
      case Func::kRelu:
        return ours("relu");
      case Func::kGelu:
        return ours("gelu");
      case Func::kSigmoid:
        return ours("sigmoid");
      case Func::kTanh:
        return libm("tanh");
      case Func::kPow:
        return absl::StrCat(f32 ? "powf(" : "pow(", a, ", ", Arg(n, 1), ")");
      case Func::kMaximum:
        return ours2("max");
      case Func::kMinimum:
        return ours2("min");
      case Func::kSin:
        return libm("sin");
      case Func::kCos:
        return libm("cos");
      case Func::kTan:
        return libm("tan");
      case Func::kArcsin:
        return libm("asin");
      case Func::kArccos:
        return libm("acos");
      case Func::kArctan:
        return libm("atan");
      case Func::kSinh:
        return libm("sinh");
      case Func::kCosh:
        return libm("cosh");
      case Func::kArcsinh:
        return libm("asinh");
      case Func::kArccosh:
        return libm("acosh");
      case Func::kArctanh:
        return libm("atanh");
      case Func::kLog10:
        return libm("log10");
      case Func::kLog2:
        return libm("log2");
      case Func::kLog1p:
        return libm("log1p");
      case Func::kExp2:
        return libm("exp2");
      case Func::kExpm1:
        return libm("expm1");
      case Func::kCbrt:
        return libm("cbrt");
      case Func::kCeil:
        return libm("ceil");
      case Func::kFloor:
        return libm("floor");
      case Func::kTrunc:
        return libm("trunc");
      case Func::kRound:
        return libm("rint");  // half to even
      case Func::kIsnan:
        return absl::StrCat("(", a, " != ", a, ")");
      case Func::kIsinf:
        return ours("isinf");
      case Func::kIsfinite:
        return ours("isfinite");
      case Func::kArctan2:
        return libm2("atan2");
      case Func::kHypot:
        return libm2("hypot");
      case Func::kCopysign:
        return libm2("copysign");
    }
    return a;
  }

  const Program& program_;
  const Definition& d_;
};

// Inputs that the nodes of `used` read, in index order.
std::vector<int> InputsRead(const Program& program, const std::vector<bool>& used) {
  std::vector<bool> read(program.definition.inputs.size(), false);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    if (used[i] && program.nodes[i].kind == NodeKind::kInput) {
      read[static_cast<size_t>(program.nodes[i].index)] = true;
    }
  }
  std::vector<int> inputs;
  for (size_t k = 0; k < read.size(); ++k) {
    if (read[k]) inputs.push_back(static_cast<int>(k));
  }
  return inputs;
}

// Declares in<k> for each input read, loaded at offset o<k>.
void LoadInputs(const Program& program, const std::vector<int>& inputs, const std::string& indent,
                std::string& out) {
  for (int k : inputs) {
    const DType dtype = program.definition.inputs[static_cast<size_t>(k)].dtype;
    absl::StrAppend(&out, indent, "const ", TypeName(ComputeType(dtype)), " in", k, " = ",
                    LoadValue(k, dtype, absl::StrCat("o", k)), ";\n");
  }
}

// Adds to o<k> the offsets of linear index `index` over `rank` dimensions of `shape`, with
// the strides `strides`[k][d], for each input read.
void Decompose(const std::vector<int>& inputs, const std::string& index, const std::string& rank,
               const std::string& shape, const std::string& strides, const std::string& indent,
               std::string& out) {
  if (inputs.empty()) return;
  absl::StrAppend(&out, indent, "{\n", indent, "  tk_i64 rest = ", index, ";\n", indent,
                  "  for (int d = (int)", rank, " - 1; d >= 0; --d) {\n", indent,
                  "    const tk_i64 extent = p.", shape, "[d];\n", indent,
                  "    const tk_i64 at = rest % extent;\n", indent, "    rest /= extent;\n");
  for (int k : inputs) {
    absl::StrAppend(&out, indent, "    o", k, " += at * p.", strides, "[", k * kRank, " + d];\n");
  }
  absl::StrAppend(&out, indent, "  }\n", indent, "}\n");
}

std::string Header(const Program& program, const std::string& entry) {
  std::string name;
  for (char c : program.definition.name) {
    name += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  std::string out = absl::StrCat(
      "// Tessera tenant-defined kernel \"", name, "\" (program ", program.hash, "),\n",
      "// generated by kernels/expr/cuda_codegen.cc: entry point ", entry, ".\n");
  absl::StrAppend(&out, kCudaPrelude, "\nstruct TkParams {\n");
  for (const CudaParamField& f : CudaParamFields(program)) {
    absl::StrAppend(&out, "  ", f.name == "in" || f.name == "out" ? "tk_u64 " : "tk_i64 ", f.name,
                    f.array ? absl::StrCat("[", f.count, "]") : "", ";\n");
  }
  absl::StrAppend(&out, "};\n\n");
  return out;
}

std::string Elementwise(const Program& program, const std::string& entry) {
  const Definition& d = program.definition;
  std::vector<bool> used(program.nodes.size(), false);
  for (int32_t r : program.results) {
    const std::vector<bool> reach = Reachable(program, r);
    for (size_t i = 0; i < used.size(); ++i) used[i] = used[i] || reach[i];
  }
  const std::vector<int> inputs = InputsRead(program, used);
  std::string out = Header(program, entry);
  absl::StrAppend(&out, "extern \"C\" __global__ void __launch_bounds__(", kCudaUserBlock, ") ",
                  entry, "(const TkParams p) {\n",
                  "  const tk_i64 step = (tk_i64)gridDim.x * blockDim.x;\n",
                  "  for (tk_i64 i = (tk_i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; "
                  "i += step) {\n");
  for (int k : inputs) absl::StrAppend(&out, "    tk_i64 o", k, " = i;\n");
  if (!inputs.empty()) {
    absl::StrAppend(&out, "    if (!p.contiguous) {\n");
    for (int k : inputs) absl::StrAppend(&out, "      o", k, " = 0;\n");
    Decompose(inputs, "i", "p.rank", "shape", "stride", "      ", out);
    absl::StrAppend(&out, "    }\n");
  }
  LoadInputs(program, inputs, "    ", out);
  Emitter(program).Nodes(used, "    ", out);
  for (size_t k = 0; k < d.outputs.size(); ++k) {
    const int32_t r = program.results[k];
    const DType dtype = d.outputs[k].dtype;
    absl::StrAppend(
        &out, "    reinterpret_cast<", StorageName(dtype), "*>(p.out[", k, "])[i] = ",
        StoreValue(absl::StrCat("v", r), program.nodes[static_cast<size_t>(r)].type, dtype), ";\n");
  }
  absl::StrAppend(&out, "  }\n}\n");
  return out;
}

// The identity of a reduction's combine, as a CUDA expression of the accumulator's type.
// (Returned, not assigned in Reduce's switch: GCC 12 -O3 reports a bogus -Wrestrict on
// assigning a one-character literal to a std::string, GCC bug 105329.)
std::string Identity(Combine combine, Type acc_type) {
  const bool float_acc = IsFloat(acc_type);
  const std::string inf = acc_type == Type::kF32 ? F32Literal(INFINITY) : F64Literal(INFINITY);
  switch (combine) {
    case Combine::kSum:
      return Convert("0", Type::kI64, acc_type);
    case Combine::kProd:
      return Convert("1", Type::kI64, acc_type);
    case Combine::kMax:  // accumulating in i64 or a float (CheckProgram)
      return float_acc ? absl::StrCat("-", inf) : "TK_I64_MIN";
    case Combine::kMin:
      return float_acc ? inf : "TK_I64_MAX";
    case Combine::kArgmin:
    case Combine::kArgmax:
      return "0";
  }
  return "0";
}

std::string Reduce(const Program& program, const std::string& entry) {
  const Reduction& red = *program.reduction;
  const Definition& d = program.definition;
  const bool arg = red.combine == Combine::kArgmin || red.combine == Combine::kArgmax;
  const std::vector<bool> map = Reachable(program, red.map);
  const std::vector<bool> post = Reachable(program, program.results[0]);
  const std::vector<int> inputs = InputsRead(program, map);
  const Type map_type = program.nodes[static_cast<size_t>(red.map)].type;
  // The combined value: the accumulator, or for argmin/argmax the best value (bool as int,
  // which shuffles) and its index.
  const Type acc_type = arg ? map_type : red.accumulate;
  const std::string acc = acc_type == Type::kBool ? "int" : TypeName(acc_type);
  const bool float_acc = IsFloat(acc_type);
  std::string out = Header(program, entry);

  // tk_init: the identity; tk_combine / tk_better: the combine.
  const std::string identity = Identity(red.combine, acc_type);
  if (!arg) {
    std::string combine;
    const bool ints = acc_type == Type::kI64;
    switch (red.combine) {
      case Combine::kSum:
        combine = ints ? "tk_add_i64(a, b)" : "a + b";
        break;
      case Combine::kProd:
        combine = ints ? "tk_mul_i64(a, b)" : "a * b";
        break;
      case Combine::kMax:  // NaN, once seen, stays
        combine = float_acc ? "(a != a) ? a : ((b != b || b > a) ? b : a)" : "b > a ? b : a";
        break;
      case Combine::kMin:
        combine = float_acc ? "(a != a) ? a : ((b != b || b < a) ? b : a)" : "b < a ? b : a";
        break;
      default:
        break;
    }
    absl::StrAppend(&out, "static __device__ __forceinline__ ", acc, " tk_combine(", acc, " a, ",
                    acc, " b) { return ", combine, "; }\n\n");
  } else {
    // Whether (a, ia) beats (b, ib): an index < 0 is no candidate; NaN beats numbers (it is
    // the largest for argmax, the smallest for argmin); ties go to the first index.
    const char* order = red.combine == Combine::kArgmax ? ">" : "<";
    absl::StrAppend(&out, "static __device__ __forceinline__ bool tk_better(", acc,
                    " a, tk_i64 ia, ", acc, " b, tk_i64 ib) {\n", "  if (ib < 0) return true;\n",
                    "  if (ia < 0) return false;\n");
    if (float_acc) {
      absl::StrAppend(&out, "  const bool na = a != a, nb = b != b;\n",
                      "  if (na != nb) return na;\n", "  if (!na && a != b) return a ", order,
                      " b;\n");
    } else {
      absl::StrAppend(&out, "  if (a != b) return a ", order, " b;\n");
    }
    absl::StrAppend(&out, "  return ia < ib;\n}\n\n");
  }

  // tk_base: each input's offset of kept element o.
  absl::StrAppend(&out,
                  "static __device__ __forceinline__ void tk_base(const TkParams& p, tk_i64 o, "
                  "tk_i64* base) {\n");
  for (int k : inputs) absl::StrAppend(&out, "  tk_i64 o", k, " = 0;\n");
  Decompose(inputs, "o", "p.kept_rank", "kept_shape", "kept_stride", "  ", out);
  for (int k : inputs) absl::StrAppend(&out, "  base[", k, "] = o", k, ";\n");
  absl::StrAppend(&out, "}\n\n");

  // tk_element: the map expression at reduced element r of the kept element at `base`.
  absl::StrAppend(&out, "static __device__ __forceinline__ ", acc,
                  " tk_element(const TkParams& p, const tk_i64* base, tk_i64 r) {\n");
  for (int k : inputs) absl::StrAppend(&out, "  tk_i64 o", k, " = base[", k, "];\n");
  Decompose(inputs, "r", "p.reduced_rank", "reduced_shape", "reduced_stride", "  ", out);
  LoadInputs(program, inputs, "  ", out);
  Emitter(program).Nodes(map, "  ", out);
  absl::StrAppend(&out, "  return ",
                  acc_type == Type::kBool ? absl::StrCat("v", red.map, " ? 1 : 0")
                                          : Convert(absl::StrCat("v", red.map), map_type, acc_type),
                  ";\n}\n\n");

  // tk_finish: the post-expression, stored at output element o.
  const std::string reduced_param = arg ? "tk_i64 index" : absl::StrCat(acc, " acc");
  absl::StrAppend(&out, "static __device__ __forceinline__ void tk_finish(const TkParams& p, ",
                  reduced_param, ", tk_i64 o) {\n");
  Emitter(program).Nodes(post, "  ", out);
  const int32_t result = program.results[0];
  const DType out_dtype = d.outputs[0].dtype;
  absl::StrAppend(&out, "  reinterpret_cast<", StorageName(out_dtype), "*>(p.out[0])[o] = ",
                  StoreValue(absl::StrCat("v", result),
                             program.nodes[static_cast<size_t>(result)].type, out_dtype),
                  ";\n}\n\n");

  // The entry point.
  const std::string declare =
      arg ? absl::StrCat(acc, " best = ", identity, ";\n", "tk_i64 index = -1;\n")
          : absl::StrCat(acc, " acc = ", identity, ";\n");
  auto indented = [](const std::string& text, const std::string& indent) {
    std::string lines;
    size_t start = 0;
    while (start < text.size()) {
      const size_t end = text.find('\n', start);
      absl::StrAppend(&lines, indent, text.substr(start, end - start + 1));
      start = end + 1;
    }
    return lines;
  };
  const std::string take =
      arg ? "{\n  const " + acc +
                " v = tk_element(p, base, r);\n"
                "  if (tk_better(v, r, best, index)) {\n    best = v;\n    index = r;\n  }\n}\n"
          : "acc = tk_combine(acc, tk_element(p, base, r));\n";
  const std::string shuffle =
      arg ? "{\n  const " + acc +
                " v = __shfl_down_sync(0xffffffffu, best, offset);\n"
                "  const tk_i64 k = __shfl_down_sync(0xffffffffu, index, offset);\n"
                "  if (tk_better(v, k, best, index)) {\n    best = v;\n    index = k;\n  }\n}\n"
          : "acc = tk_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));\n";
  const std::string finish = arg ? "tk_finish(p, index, o);\n" : "tk_finish(p, acc, o);\n";
  // One warp per kept element (p.warp_per_output) or one block: `group` threads share an
  // element, this one being `member` of them; the element's code is emitted once for both.
  const std::string shared = arg ? absl::StrCat("  __shared__ ", acc, " tk_values[32];\n",
                                                "  __shared__ tk_i64 tk_indexes[32];\n")
                                 : absl::StrCat("  __shared__ ", acc, " tk_partial[32];\n");
  const std::string publish =
      arg ? "tk_values[warp] = best;\ntk_indexes[warp] = index;\n" : "tk_partial[warp] = acc;\n";
  const std::string gather =
      arg ? "if (lane < warps) {\n  best = tk_values[lane];\n  index = tk_indexes[lane];\n"
            "} else {\n  best = " +
                identity + ";\n  index = -1;\n}\n"
          : "acc = lane < warps ? tk_partial[lane] : tk_partial[0];\n";
  const std::string last_shuffle =
      arg ? shuffle
          : "{\n  const " + acc +
                " other = __shfl_down_sync(0xffffffffu, acc, offset);\n"
                "  if (lane + offset < warps) acc = tk_combine(acc, other);\n}\n";
  absl::StrAppend(
      &out, "extern \"C\" __global__ void __launch_bounds__(", kCudaUserMaxReduceBlock, ") ", entry,
      "(const TkParams p) {\n", "  const bool by_warp = p.warp_per_output != 0;\n",
      "  const int lane = (int)(threadIdx.x % 32u);\n",
      "  const int warp = (int)(threadIdx.x / 32u), warps = (int)(blockDim.x / 32u);\n",
      "  const tk_i64 group = by_warp ? 32 : (tk_i64)blockDim.x;\n",
      "  const tk_i64 member = by_warp ? (tk_i64)lane : (tk_i64)threadIdx.x;\n",
      "  const tk_i64 first = by_warp ? (tk_i64)blockIdx.x * warps + warp : (tk_i64)blockIdx.x;\n",
      "  const tk_i64 step = by_warp ? (tk_i64)gridDim.x * warps : (tk_i64)gridDim.x;\n", shared,
      "  tk_i64 base[", d.inputs.size(), "];\n", "  for (tk_i64 o = first; o < p.n; o += step) {\n",
      "    tk_base(p, o, base);\n", indented(declare, "    "),
      "    for (tk_i64 r = member; r < p.count; r += group) {\n", indented(take, "      "),
      "    }\n", "    for (int offset = 16; offset > 0; offset /= 2) {\n",
      indented(shuffle, "      "), "    }\n",
      "    if (!by_warp) {  // the warps' results, through shared memory, to warp 0\n",
      "      __syncthreads();  // the previous element's reads of them are done\n",
      "      if (lane == 0) {\n", indented(publish, "        "), "      }\n",
      "      __syncthreads();\n", "      if (warp == 0) {\n", indented(gather, "        "),
      "        for (int offset = 16; offset > 0; offset /= 2) {\n",
      indented(last_shuffle, "          "), "        }\n", "      }\n", "    }\n",
      "    if (member == 0) {\n", indented(finish, "      "), "    }\n", "  }\n}\n");
  return out;
}

}  // namespace

absl::StatusOr<CudaKernelSource> GenerateCudaKernel(const Program& program) {
  if (absl::Status s = CheckProgram(program); !s.ok()) return s;
  CudaKernelSource kernel;
  kernel.entry = absl::StrCat("tessera_user_", program.hash);
  kernel.reduction = program.reduction.has_value();
  kernel.source =
      kernel.reduction ? Reduce(program, kernel.entry) : Elementwise(program, kernel.entry);
  return kernel;
}

}  // namespace tessera::kernels::expr
