#include "tests/fake_cuda/user_kernel_corpus.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <openssl/evp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "kernels/dtype.h"
#include "kernels/expr/names.h"
#include "kernels/shape.h"

namespace tessera::testing {
namespace {

using kernels::DType;
using kernels::Shape;
using kernels::expr::BinaryOp;
using kernels::expr::Combine;
using kernels::expr::Func;
using kernels::expr::Node;
using kernels::expr::NodeKind;
using kernels::expr::Program;
using kernels::expr::ScalarKind;
using kernels::expr::Type;
using kernels::expr::UnaryOp;

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < size; ++i)
    absl::StrAppend(&hex, absl::Hex(digest[i], absl::kZeroPad2));
  return hex;
}

using kernels::expr::internal::IsFloat;

}  // namespace

// ---- ProgramBuilder -------------------------------------------------------------------------

int ProgramBuilder::AddInput(const std::string& name, DType dtype, int rank) {
  program_.definition.inputs.push_back({name, dtype, rank});
  return static_cast<int>(program_.definition.inputs.size()) - 1;
}

int ProgramBuilder::AddOutput(const std::string& name, DType dtype, int rank) {
  program_.definition.outputs.push_back({name, dtype, rank});
  return static_cast<int>(program_.definition.outputs.size()) - 1;
}

int ProgramBuilder::AddParam(const std::string& name, ScalarKind kind,
                             std::optional<double> default_value) {
  program_.definition.params.push_back({name, kind, default_value});
  return static_cast<int>(program_.definition.params.size()) - 1;
}

int32_t ProgramBuilder::Add(Node node) {
  program_.nodes.push_back(std::move(node));
  return static_cast<int32_t>(program_.nodes.size()) - 1;
}

int32_t ProgramBuilder::Input(int input) {
  Node n;
  n.kind = NodeKind::kInput;
  n.type = kernels::expr::ComputeType(program_.definition.inputs[static_cast<size_t>(input)].dtype);
  n.index = input;
  return Add(n);
}

int32_t ProgramBuilder::Param(int param, Type type) {
  Node n;
  n.kind = NodeKind::kParam;
  n.type = type;
  n.index = param;
  return Add(n);
}

int32_t ProgramBuilder::Const(Type type, double value) {
  Node n;
  n.kind = NodeKind::kConst;
  n.type = type;
  if (IsFloat(type)) {
    n.f = value;
  } else {
    n.i = static_cast<int64_t>(value);
  }
  return Add(n);
}

int32_t ProgramBuilder::ConstInt(int64_t value) {
  Node n;
  n.kind = NodeKind::kConst;
  n.type = Type::kI64;
  n.i = value;
  return Add(n);
}

int32_t ProgramBuilder::Cast(int32_t a, Type type) {
  if (TypeOf(a) == type) return a;
  Node n;
  n.kind = NodeKind::kCast;
  n.type = type;
  n.args = {a};
  return Add(n);
}

int32_t ProgramBuilder::Unary(UnaryOp op, int32_t a) {
  Node n;
  n.kind = NodeKind::kUnary;
  n.type = op == UnaryOp::kNot ? Type::kBool : TypeOf(a);
  n.op = static_cast<uint8_t>(op);
  n.args = {a};
  return Add(n);
}

int32_t ProgramBuilder::Binary(BinaryOp op, int32_t a, int32_t b) {
  Node n;
  n.kind = NodeKind::kBinary;
  n.type = op >= BinaryOp::kLt && op <= BinaryOp::kNe ? Type::kBool : TypeOf(a);
  n.op = static_cast<uint8_t>(op);
  n.args = {a, b};
  return Add(n);
}

int32_t ProgramBuilder::Call(Func f, int32_t a, int32_t b) {
  Node n;
  n.kind = NodeKind::kCall;
  n.type = kernels::expr::IsPredicate(f) ? Type::kBool : TypeOf(a);
  n.op = static_cast<uint8_t>(f);
  n.args = {a};
  if (b >= 0) n.args.push_back(b);
  return Add(n);
}

int32_t ProgramBuilder::Where(int32_t condition, int32_t a, int32_t b) {
  Node n;
  n.kind = NodeKind::kWhere;
  n.type = TypeOf(a);
  n.args = {condition, a, b};
  return Add(n);
}

int32_t ProgramBuilder::Reduced() {
  Node n;
  n.kind = NodeKind::kReduced;
  n.type = program_.reduction->accumulate;
  return Add(n);
}

int32_t ProgramBuilder::Count() {
  Node n;
  n.kind = NodeKind::kCount;
  n.type = Type::kI64;
  return Add(n);
}

void ProgramBuilder::Reduce(Combine combine, int32_t map) {
  kernels::expr::Reduction r;
  r.combine = combine;
  r.map = map;
  const Type t = TypeOf(map);
  if (combine == Combine::kArgmin || combine == Combine::kArgmax) {
    r.accumulate = Type::kI64;
  } else if (combine == Combine::kSum || combine == Combine::kProd) {
    r.accumulate = t == Type::kBool ? Type::kI64 : t;
  } else {
    r.accumulate = t;
  }
  program_.reduction = r;
}

Program ProgramBuilder::Build() {
  // The hash covers everything the code depends on, as the checker's covers the definition.
  const kernels::expr::Definition& d = program_.definition;
  std::string text = absl::StrCat(d.name, "|");
  for (const auto& in : d.inputs) absl::StrAppend(&text, "in ", static_cast<int>(in.dtype), ";");
  for (const auto& out : d.outputs)
    absl::StrAppend(&text, "out ", static_cast<int>(out.dtype), ";");
  for (const auto& p : d.params) absl::StrAppend(&text, "param ", static_cast<int>(p.kind), ";");
  for (const Node& n : program_.nodes) {
    absl::StrAppend(&text, "n ", static_cast<int>(n.kind), " ", static_cast<int>(n.type), " ", n.op,
                    " ", n.index, " ", n.i, " ", std::bit_cast<uint64_t>(n.f), " (",
                    absl::StrJoin(n.args, ","), ");");
  }
  absl::StrAppend(&text, "r ", absl::StrJoin(program_.results, ","));
  if (program_.reduction) {
    absl::StrAppend(&text, "red ", static_cast<int>(program_.reduction->combine), " ",
                    program_.reduction->map, " ", static_cast<int>(program_.reduction->accumulate));
  }
  program_.hash = Sha256Hex(text);
  return program_;
}

// ---- Plans ----------------------------------------------------------------------------------

std::shared_ptr<const kernels::expr::UserKernel> UserKernelOf(Program program) {
  auto kernel = std::make_shared<kernels::expr::UserKernel>();
  kernel->def.name = program.definition.name;
  kernel->def.op = kernels::Op::kUser;
  kernel->program = std::move(program);
  return kernel;
}

kernels::Plan UserPlan(const std::shared_ptr<const kernels::expr::UserKernel>& kernel,
                       const std::vector<Shape>& shapes, kernels::Attrs attrs) {
  const Program& program = kernel->program;
  kernels::Plan plan;
  plan.kernel = &kernel->def;
  plan.user = kernel;
  Shape shape;
  for (size_t k = 0; k < shapes.size(); ++k) {
    plan.inputs.push_back({program.definition.inputs[k].dtype, shapes[k]});
    shape = *kernels::BroadcastShapes(shape, shapes[k]);
  }
  for (const auto& p : program.definition.params) {
    if (attrs.count(p.name) != 0 || !p.default_value) continue;
    if (p.kind == ScalarKind::kInt) {
      attrs[p.name] = static_cast<int64_t>(*p.default_value);
    } else {
      attrs[p.name] = *p.default_value;
    }
  }
  if (program.reduction) {
    if (attrs.count("axes") == 0) attrs["axes"] = std::vector<int64_t>{};
    if (attrs.count("keepdims") == 0) attrs["keepdims"] = false;
    const auto& axes = kernels::AttrInts(attrs, "axes");
    const bool keepdims = kernels::AttrBool(attrs, "keepdims");
    Shape out;
    for (size_t d = 0; d < shape.size(); ++d) {
      bool reduced = axes.empty();
      for (int64_t a : axes) {
        reduced = reduced ||
                  (a < 0 ? a + static_cast<int64_t>(shape.size()) : a) == static_cast<int64_t>(d);
      }
      if (!reduced) {
        out.push_back(shape[d]);
      } else if (keepdims) {
        out.push_back(1);
      }
    }
    shape = out;
  }
  for (const auto& o : program.definition.outputs) plan.outputs.push_back({o.dtype, shape});
  plan.attrs = std::move(attrs);
  return plan;
}

// ---- The corpus -----------------------------------------------------------------------------

namespace {

class Generator {
 public:
  Generator(ProgramBuilder& b, std::mt19937& rng, int inputs, int params)
      : b_(b), rng_(rng), inputs_(inputs), params_(params) {}

  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  // A random expression of type `t`, at most `depth` levels deep.
  int32_t Expr(Type t, int depth) {
    if (depth <= 0 || Chance(0.25)) return Leaf(t);
    if (t == Type::kBool) return BoolExpr(depth);
    switch (Pick(6)) {
      case 0:
      case 1: {
        static constexpr BinaryOp kOps[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul,
                                            BinaryOp::kDiv, BinaryOp::kMod};
        // Integers also get the bit operations, shifts by counts in and out of 0..63.
        static constexpr BinaryOp kBits[] = {BinaryOp::kBitAnd, BinaryOp::kBitOr, BinaryOp::kBitXor,
                                             BinaryOp::kShl, BinaryOp::kShr};
        if (t == Type::kI64 && Chance(0.35)) {
          const BinaryOp op = kBits[Pick(5)];
          static constexpr int64_t kCounts[] = {0, 1, 7, 63, 64, -1};
          const bool shift = op == BinaryOp::kShl || op == BinaryOp::kShr;
          const int32_t count =
              shift && Chance(0.5) ? b_.ConstInt(kCounts[Pick(6)]) : Expr(t, depth - 1);
          return b_.Binary(op, Expr(t, depth - 1), count);
        }
        const BinaryOp op = kOps[Pick(Chance(0.7) ? 3 : 5)];
        return b_.Binary(op, Expr(t, depth - 1), Expr(t, depth - 1));
      }
      case 2:
        if (t == Type::kI64) {
          static constexpr Func kInt[] = {Func::kAbs, Func::kMaximum, Func::kMinimum};
          const Func f = kInt[Pick(3)];
          return f == Func::kAbs ? b_.Call(f, Expr(t, depth - 1))
                                 : b_.Call(f, Expr(t, depth - 1), Expr(t, depth - 1));
        } else {
          // Every float function but the predicates (BoolExpr).
          std::vector<Func> functions;
          for (int f = 0; f <= static_cast<int>(kernels::expr::kLastFunc); ++f) {
            if (!kernels::expr::IsPredicate(static_cast<Func>(f))) {
              functions.push_back(static_cast<Func>(f));
            }
          }
          const Func f = functions[static_cast<size_t>(Pick(static_cast<int>(functions.size())))];
          const bool two = kernels::expr::FuncArity(f) == 2;
          return two ? b_.Call(f, Expr(t, depth - 1), Expr(t, depth - 1))
                     : b_.Call(f, Expr(t, depth - 1));
        }
      case 3:
        if (t == Type::kI64 && Chance(0.3)) return b_.Unary(UnaryOp::kBitNot, Expr(t, depth - 1));
        return b_.Unary(UnaryOp::kNeg, Expr(t, depth - 1));
      case 4:
        return b_.Where(BoolExpr(depth - 1), Expr(t, depth - 1), Expr(t, depth - 1));
      default: {
        static constexpr Type kTypes[] = {Type::kBool, Type::kI64, Type::kF32, Type::kF64};
        return b_.Cast(Expr(kTypes[Pick(4)], depth - 1), t);
      }
    }
  }

  int32_t BoolExpr(int depth) {
    if (depth <= 0) return Leaf(Type::kBool);
    switch (Pick(4)) {
      case 0: {
        static constexpr Type kTypes[] = {Type::kI64, Type::kF32, Type::kF64};
        const Type u = kTypes[Pick(3)];
        static constexpr BinaryOp kCmp[] = {BinaryOp::kLt, BinaryOp::kLe, BinaryOp::kGt,
                                            BinaryOp::kGe, BinaryOp::kEq, BinaryOp::kNe};
        return b_.Binary(kCmp[Pick(6)], Expr(u, depth - 1), Expr(u, depth - 1));
      }
      case 1:
        return b_.Binary(Chance(0.5) ? BinaryOp::kAnd : BinaryOp::kOr, Expr(Type::kBool, depth - 1),
                         Expr(Type::kBool, depth - 1));
      case 2:
        return b_.Unary(UnaryOp::kNot, Expr(Type::kBool, depth - 1));
      default: {
        if (Chance(0.5)) return Leaf(Type::kBool);
        static constexpr Func kPredicates[] = {Func::kIsnan, Func::kIsinf, Func::kIsfinite};
        return b_.Call(kPredicates[Pick(3)],
                       Expr(Chance(0.5) ? Type::kF32 : Type::kF64, depth - 1));
      }
    }
  }

  int32_t Leaf(Type t) {
    const int choice = Pick(10);
    if (choice < 6 || (params_ == 0 && choice < 8)) return b_.Cast(b_.Input(Pick(inputs_)), t);
    if (choice < 8 && params_ > 0) {
      const int p = Pick(params_);
      return b_.Param(p, t);
    }
    switch (t) {
      case Type::kBool:
        return b_.Const(t, Pick(2));
      case Type::kI64: {
        static constexpr int64_t kInts[] = {0, 1, -1, 2, 7, -3, 1000, INT64_MIN, INT64_MAX};
        return b_.ConstInt(kInts[Pick(9)]);
      }
      default: {
        static const double kFloats[] = {0.0,
                                         -0.0,
                                         1.0,
                                         0.5,
                                         -2.25,
                                         3.0e-5,
                                         1.702,
                                         std::numeric_limits<double>::infinity(),
                                         std::numeric_limits<double>::quiet_NaN(),
                                         0.1};
        return b_.Const(t, kFloats[Pick(10)]);
      }
    }
  }

 private:
  ProgramBuilder& b_;
  std::mt19937& rng_;
  int inputs_, params_;
};

// A broadcast shape of rank 0..4 and input shapes that broadcast to it (a suffix of it, with
// some dimensions 1). `empty`: one dimension may be 0.
std::vector<Shape> Shapes(std::mt19937& rng, int inputs, int64_t max_dim, bool empty) {
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  const int rank = pick(5);
  Shape shape;
  for (int d = 0; d < rank; ++d) shape.push_back(1 + pick(static_cast<int>(max_dim)));
  if (empty && rank > 0 && pick(12) == 0) shape[static_cast<size_t>(pick(rank))] = 0;
  std::vector<Shape> shapes;
  for (int k = 0; k < inputs; ++k) {
    const int r = k == 0 ? rank : pick(rank + 1);  // the first has the full rank
    Shape s(shape.end() - r, shape.end());
    for (int64_t& d : s) {
      if (k > 0 && pick(3) == 0) d = 1;
    }
    shapes.push_back(s);
  }
  return shapes;
}

DType RandomDType(std::mt19937& rng) {
  return kernels::kAllDTypes[std::uniform_int_distribution<int>(0, 7)(rng)];
}

UserCase Elementwise(int id, std::mt19937& rng) {
  ProgramBuilder b(absl::StrCat("ew", id));
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  const int inputs = 1 + pick(4);
  for (int k = 0; k < inputs; ++k) b.AddInput(absl::StrCat("x", k), RandomDType(rng));
  const int params = pick(3);
  kernels::Attrs attrs;
  for (int p = 0; p < params; ++p) {
    const bool is_int = pick(2) == 0;
    const std::string name = absl::StrCat("p", p);
    b.AddParam(name, is_int ? ScalarKind::kInt : ScalarKind::kFloat, is_int ? 3.0 : 0.75);
    if (pick(2) == 0) {
      if (is_int) {
        attrs[name] = int64_t{-5};
      } else {
        attrs[name] = 2.5;
      }
    }
  }
  Generator g(b, rng, inputs, params);
  const int outputs = 1 + pick(2);
  static constexpr Type kTypes[] = {Type::kBool, Type::kI64, Type::kF32, Type::kF64};
  for (int o = 0; o < outputs; ++o) {
    b.AddOutput(absl::StrCat("y", o), RandomDType(rng));
    b.Result(g.Expr(kTypes[pick(4)], 1 + pick(4)));
  }
  auto kernel = UserKernelOf(b.Build());
  UserCase c;
  c.plan = UserPlan(kernel, Shapes(rng, inputs, 7, true), std::move(attrs));
  c.kernel = kernel;
  c.description = absl::StrCat("element-wise program ", id);
  return c;
}

UserCase Reduction(int id, std::mt19937& rng) {
  ProgramBuilder b(absl::StrCat("red", id));
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  const int inputs = 1 + pick(3);
  for (int k = 0; k < inputs; ++k) b.AddInput(absl::StrCat("x", k), RandomDType(rng));
  const int params = pick(2);
  for (int p = 0; p < params; ++p) b.AddParam(absl::StrCat("p", p), ScalarKind::kFloat, 1.5);
  Generator g(b, rng, inputs, params);
  static constexpr Combine kCombines[] = {Combine::kSum, Combine::kProd,   Combine::kMin,
                                          Combine::kMax, Combine::kArgmin, Combine::kArgmax};
  const Combine combine = kCombines[pick(6)];
  const bool arg = combine == Combine::kArgmin || combine == Combine::kArgmax;
  static constexpr Type kTypes[] = {Type::kI64, Type::kF32, Type::kF64, Type::kBool};
  const Type t = kTypes[pick(arg ? 4 : 3)];  // bool maps only for argmin/argmax, as the checker
  int32_t map = 0;
  if (combine == Combine::kProd && t != Type::kI64) {
    // Factors of magnitude 0.5 to 2 (or NaN), so that no order of multiplication over these
    // few elements overflows or underflows: v = clamp(x / 2, -2, 2), 1 where |v| < 0.5.
    const int32_t v =
        b.Call(Func::kMaximum,
               b.Call(Func::kMinimum,
                      b.Binary(BinaryOp::kMul, b.Cast(b.Input(pick(inputs)), t), b.Const(t, 0.5)),
                      b.Const(t, 2.0)),
               b.Const(t, -2.0));
    map = b.Where(b.Binary(BinaryOp::kLt, b.Call(Func::kAbs, v), b.Const(t, 0.5)), b.Const(t, 1.0),
                  v);
  } else {
    map = g.Expr(t, combine == Combine::kSum ? 1 + pick(2) : 1 + pick(3));
  }
  b.Reduce(combine, map);
  const Type acc = b.TypeOf(b.Reduced());
  // A post-expression on the combined value: none, a mean, a scale by a parameter, a shift.
  int32_t post = b.Reduced();
  switch (pick(4)) {
    case 1:
      if (IsFloat(acc)) post = b.Binary(BinaryOp::kDiv, post, b.Cast(b.Count(), acc));
      break;
    case 2:
      if (IsFloat(acc) && params > 0) post = b.Binary(BinaryOp::kMul, post, b.Param(0, acc));
      break;
    case 3:
      if (acc == Type::kI64) post = b.Binary(BinaryOp::kAdd, post, b.ConstInt(1));
      break;
    default:
      break;
  }
  b.AddOutput("y", arg ? (pick(2) == 0 ? DType::kI64 : RandomDType(rng)) : RandomDType(rng));
  b.Result(post);
  auto kernel = UserKernelOf(b.Build());
  // Products over few elements; argmin/argmax over no empty axis.
  std::vector<Shape> shapes =
      Shapes(rng, inputs, combine == Combine::kProd ? 3 : 9, !arg && combine != Combine::kProd);
  Shape shape;
  for (const Shape& s : shapes) shape = *kernels::BroadcastShapes(shape, s);
  kernels::Attrs attrs;
  std::vector<int64_t> axes;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (pick(2) == 0)
      axes.push_back(pick(2) == 0 ? static_cast<int64_t>(d)
                                  : static_cast<int64_t>(d) - static_cast<int64_t>(shape.size()));
  }
  attrs["axes"] = axes;
  attrs["keepdims"] = pick(2) == 0;
  UserCase c;
  c.plan = UserPlan(kernel, shapes, std::move(attrs));
  c.kernel = kernel;
  c.description = absl::StrCat("reduction program ", id);
  return c;
}

}  // namespace

std::vector<UserCase> Corpus(int elementwise, int reductions, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<UserCase> cases;
  for (int i = 0; i < elementwise; ++i) cases.push_back(Elementwise(i, rng));
  for (int i = 0; i < reductions; ++i) cases.push_back(Reduction(i, rng));
  return cases;
}

std::set<std::string> Features(const UserCase& c) {
  std::set<std::string> features;
  for (const kernels::TensorMeta& m : c.plan.inputs) {
    features.insert(absl::StrCat("input ", kernels::DTypeName(m.dtype)));
    if (m.shape != c.plan.inputs[0].shape) features.insert("inputs of different shapes");
  }
  for (const kernels::TensorMeta& m : c.plan.outputs) {
    features.insert(absl::StrCat("output ", kernels::DTypeName(m.dtype)));
    if (kernels::CheckedNumElements(m.shape) == 0) features.insert("empty output");
  }
  const Program& program = c.kernel->program;
  for (const Node& n : program.nodes) {
    const bool has_op =
        n.kind == NodeKind::kUnary || n.kind == NodeKind::kBinary || n.kind == NodeKind::kCall;
    features.insert(absl::StrCat("node ", static_cast<int>(n.kind), "/",
                                 has_op ? static_cast<int>(n.op) : -1, "/",
                                 static_cast<int>(n.type)));
  }
  if (program.reduction.has_value()) {
    features.insert(absl::StrCat("reduction ", static_cast<int>(program.reduction->combine), "/",
                                 static_cast<int>(program.reduction->accumulate)));
  }
  return features;
}

std::vector<UserCase> RepresentativeSlice(const std::vector<UserCase>& cases, int stride) {
  std::vector<UserCase> slice;
  std::set<std::string> covered;
  std::vector<std::set<std::string>> features;
  std::vector<bool> taken(cases.size(), false);
  features.reserve(cases.size());
  for (const UserCase& c : cases) features.push_back(Features(c));
  auto take = [&](size_t i) {
    slice.push_back(cases[i]);
    covered.insert(features[i].begin(), features[i].end());
    taken[i] = true;
  };
  for (size_t i = 0; i < cases.size(); i += static_cast<size_t>(stride)) take(i);
  for (;;) {  // the case adding the most features not held yet, until none adds any
    size_t best = cases.size(), best_new = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (taken[i]) continue;
      size_t added = 0;
      for (const std::string& f : features[i]) added += covered.count(f) == 0 ? 1 : 0;
      if (added > best_new) {
        best = i;
        best_new = added;
      }
    }
    if (best == cases.size()) break;
    take(best);
  }
  return slice;
}

std::vector<HostTensor> CaseInputs(const kernels::Plan& plan, std::mt19937& rng) {
  std::vector<HostTensor> inputs;
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  for (const kernels::TensorMeta& m : plan.inputs) {
    HostTensor t(m.dtype, m.shape);
    const size_t esize = kernels::DTypeSize(m.dtype);
    for (int64_t i = 0; i < t.size(); ++i) {
      uint8_t* p = t.bytes.data() + i * static_cast<int64_t>(esize);
      const double u = std::uniform_real_distribution<double>(-3, 3)(rng);
      const bool special = pick(16) == 0;
      switch (m.dtype) {
        case DType::kF32:
        case DType::kF16:
        case DType::kBF16:
        case DType::kF64: {
          static const double kSpecial[] = {0.0,
                                            -0.0,
                                            std::numeric_limits<double>::infinity(),
                                            -std::numeric_limits<double>::infinity(),
                                            std::numeric_limits<double>::quiet_NaN(),
                                            1e30,
                                            -1e-30,
                                            65504.0,
                                            3.0e9,
                                            -9.3e18};
          const double v = special ? kSpecial[pick(10)] : u;
          if (m.dtype == DType::kF64) {
            std::memcpy(p, &v, 8);
          } else if (m.dtype == DType::kF32) {
            const float f = static_cast<float>(v);
            std::memcpy(p, &f, 4);
          } else {
            const uint16_t h =
                m.dtype == DType::kF16 ? kernels::F64ToF16(v) : kernels::F64ToBF16(v);
            std::memcpy(p, &h, 2);
          }
          break;
        }
        case DType::kI32: {
          static constexpr int32_t kSpecial[] = {0, -1, 1, INT32_MIN, INT32_MAX, 255, 256};
          const int32_t v = special ? kSpecial[pick(7)] : static_cast<int32_t>(std::lround(u * 4));
          std::memcpy(p, &v, 4);
          break;
        }
        case DType::kI64: {
          static constexpr int64_t kSpecial[] = {0, -1, 1, INT64_MIN, INT64_MAX, 1ll << 40};
          const int64_t v = special ? kSpecial[pick(6)] : std::lround(u * 4);
          std::memcpy(p, &v, 8);
          break;
        }
        case DType::kU8:
          *p = special ? static_cast<uint8_t>(255 * pick(2)) : static_cast<uint8_t>(pick(12));
          break;
        case DType::kBool:
          *p = static_cast<uint8_t>(pick(2));
          break;
      }
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

}  // namespace tessera::testing
