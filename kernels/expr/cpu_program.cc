// A checked program compiled to register bytecode (kernels/expr/cpu_vm.h) and run over
// chunks: Build assigns each needed node a slot (inputs and uniform values pinned, the rest
// reused once dead) and an instruction; Run walks the broadcast geometry a chunk at a time,
// loading inputs, running the instructions and storing (elementwise) or folding into
// accumulators (reductions).
#include "kernels/expr/cpu_program.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#include "kernels/expr/cpu_vm.h"
#include "kernels/geometry.h"
#include "kernels/shape.h"

namespace tessera::kernels::expr {
namespace {

using vm::Instr;

/// Elements per chunk (a register), at most; fewer when a program needs many registers.
constexpr int64_t kMaxChunk = 1024;
/// Register memory per task, in bytes: what shrinks the chunk of a program with many slots.
constexpr int64_t kRegisterBudget = int64_t{1} << 20;
/// Element-instructions per task (a Parallel::For chunk), so that a task of any program takes
/// about as long as a catalog kernel's chunk (kElementGrain elements of one operation).
constexpr int64_t kTaskWork = int64_t{1} << 20;
constexpr int64_t kMaxTaskElements = cpu::kElementGrain;
/// The Load operand of a reduction's combined value (post-expression).
constexpr int32_t kReducedOperand = -1;

// ---- compilation -----------------------------------------------------------------------------

/// A uniform leaf: its value, the same for every element, comes from the program (a
/// constant), the launch (a parameter) or the geometry (the reduced count).
struct Cell {
  NodeKind kind = NodeKind::kConst;
  Type type = Type::kF32;
  int32_t param = 0;
  uint64_t bits = 0;  // kConst: the value in `type`
};

/// A slot filled from a tensor (or the reduction's combined values) before each chunk.
struct Load {
  int32_t operand = 0;  // input index, or kReducedOperand
  int32_t slot = 0;
};

/// The instructions computing one set of roots (an elementwise program's results, a
/// reduction's map, or its post-expression).
struct Unit {
  std::vector<Instr> prologue;  // uniform values: run once per task, over a whole chunk
  std::vector<Instr> body;      // run per chunk
  std::vector<Load> loads;
  std::vector<Cell> cells;
  std::vector<int32_t> results;  // the slot of each root
  int32_t slots = 0;
  int64_t chunk = kMaxChunk;                 // a power of two
  int64_t task_elements = kMaxTaskElements;  // a power of two, a multiple of chunk
};

template <typename T>
uint64_t BitsOf(T v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

/// `value` (double or int64_t) converted to `type`, as a cell's bits.
template <typename V>
uint64_t CellBits(Type type, V value) {
  return vm::WithType(
      type,
      [value](auto tag) {
        using T = typename decltype(tag)::type;
        return BitsOf(semantics::Convert<T>(value));
      },
      uint64_t{0});
}

absl::Status NodeError(const Program& program, size_t i, absl::string_view what) {
  const Node& n = program.nodes[i];
  return absl::InternalError(absl::StrCat("kernel ", program.definition.name, ": node ", i,
                                          " (body ", n.line, ":", n.column, ") ", what));
}

int Arity(const Node& n) {
  switch (n.kind) {
    case NodeKind::kUnary:
    case NodeKind::kCast:
      return 1;
    case NodeKind::kBinary:
      return 2;
    case NodeKind::kWhere:
      return 3;
    case NodeKind::kCall:
      return FuncArity(static_cast<Func>(n.op));
    default:
      return 0;
  }
}

enum class Part { kElementwise, kMap, kPost };

/// The typing rules of ast.h that the instructions rely on.
absl::Status CheckNode(const Program& p, size_t i, Part part) {
  const Node& n = p.nodes[i];
  if (n.args.size() != static_cast<size_t>(Arity(n))) return NodeError(p, i, "has a wrong arity");
  for (int32_t a : n.args) {
    if (a < 0 || static_cast<size_t>(a) >= i) return NodeError(p, i, "uses a later node");
  }
  auto arg_type = [&](int k) { return p.nodes[n.args[k]].type; };
  switch (n.kind) {
    case NodeKind::kInput:
      if (part == Part::kPost) return NodeError(p, i, "reads an input after the reduction");
      if (n.index < 0 || static_cast<size_t>(n.index) >= p.definition.inputs.size()) {
        return NodeError(p, i, "names no input");
      }
      if (n.type != ComputeType(p.definition.inputs[n.index].dtype)) {
        return NodeError(p, i, "has a type other than its input's compute type");
      }
      return absl::OkStatus();
    case NodeKind::kParam:
      if (n.index < 0 || static_cast<size_t>(n.index) >= p.definition.params.size()) {
        return NodeError(p, i, "names no parameter");
      }
      break;
    case NodeKind::kReduced:
      if (part != Part::kPost || n.type != p.reduction->accumulate) {
        return NodeError(p, i, "is a combined value outside a post-expression or mistyped");
      }
      return absl::OkStatus();
    case NodeKind::kCount:
      if (part != Part::kPost || n.type != Type::kI64) {
        return NodeError(p, i, "is a count outside a post-expression or not i64");
      }
      break;
    case NodeKind::kConst:
      break;
    case NodeKind::kUnary:
    case NodeKind::kCall: {
      // A predicate (isnan, ...) has a float operand and a bool result (SelectInstr checks).
      const bool predicate = n.kind == NodeKind::kCall && IsPredicate(static_cast<Func>(n.op));
      for (size_t k = 0; k < n.args.size(); ++k) {
        if (arg_type(static_cast<int>(k)) != (predicate ? arg_type(0) : n.type))
          return NodeError(p, i, "has mistyped operands");
      }
      break;
    }
    case NodeKind::kBinary: {
      const auto op = static_cast<BinaryOp>(n.op);
      const bool compare = op >= BinaryOp::kLt && op <= BinaryOp::kNe;
      if (arg_type(0) != arg_type(1) || (!compare && arg_type(0) != n.type) ||
          (compare && n.type != Type::kBool)) {
        return NodeError(p, i, "has mistyped operands");
      }
      break;
    }
    case NodeKind::kWhere:
      if (arg_type(0) != Type::kBool || arg_type(1) != n.type || arg_type(2) != n.type) {
        return NodeError(p, i, "has mistyped operands");
      }
      break;
    case NodeKind::kCast:
      break;
    default:
      return NodeError(p, i, "has an unknown kind");
  }
  if (vm::SelectInstr(n, n.args.empty() ? n.type : arg_type(0)) == nullptr) {
    return NodeError(p, i, "asks for an operation its type does not have");
  }
  return absl::OkStatus();
}

int64_t FloorPowerOfTwo(int64_t v) {
  return int64_t{1} << (63 - std::countl_zero(static_cast<uint64_t>(v)));
}

/// Compiles the nodes `roots` need: checks them, assigns slots and emits instructions.
absl::StatusOr<Unit> CompileUnit(const Program& p, const std::vector<int32_t>& roots, Part part) {
  const size_t count = p.nodes.size();
  std::vector<bool> needed(count, false);
  for (int32_t r : roots) needed[r] = true;
  for (size_t i = count; i-- > 0;) {
    if (!needed[i]) continue;
    if (absl::Status s = CheckNode(p, i, part); !s.ok()) return s;
    for (int32_t a : p.nodes[i].args) needed[a] = true;
  }
  // Uniform nodes (no input, no combined value) are computed once per task; a varying node's
  // slot is free again after its last use (roots live to the stores).
  std::vector<bool> uniform(count, false);
  std::vector<size_t> last_use(count, 0);
  for (size_t i = 0; i < count; ++i) {
    if (!needed[i]) continue;
    const Node& n = p.nodes[i];
    uniform[i] = n.kind != NodeKind::kInput && n.kind != NodeKind::kReduced;
    for (int32_t a : n.args) {
      uniform[i] = uniform[i] && uniform[a];
      last_use[a] = i;
    }
  }
  for (int32_t r : roots) last_use[r] = count;

  Unit unit;
  std::vector<int32_t> slot_of(count, -1);
  std::vector<int32_t> free_slots;
  std::vector<int32_t> input_slot(p.definition.inputs.size(), -1);
  int32_t reduced_slot = -1;
  auto new_slot = [&] { return unit.slots++; };
  auto load_slot = [&](int32_t& slot, int32_t operand) {
    if (slot < 0) {
      slot = new_slot();
      unit.loads.push_back({operand, slot});
    }
    return slot;
  };
  for (size_t i = 0; i < count; ++i) {
    if (!needed[i]) continue;
    const Node& n = p.nodes[i];
    if (n.kind == NodeKind::kInput) {
      slot_of[i] = load_slot(input_slot[n.index], n.index);
      continue;
    }
    if (n.kind == NodeKind::kReduced) {
      slot_of[i] = load_slot(reduced_slot, kReducedOperand);
      continue;
    }
    Instr instr;
    instr.fn = vm::SelectInstr(n, n.args.empty() ? n.type : p.nodes[n.args[0]].type);
    int32_t* operands[] = {&instr.a, &instr.b, &instr.c};
    for (size_t k = 0; k < n.args.size(); ++k) *operands[k] = slot_of[n.args[k]];
    if (n.kind == NodeKind::kConst || n.kind == NodeKind::kParam || n.kind == NodeKind::kCount) {
      Cell cell{n.kind, n.type, n.index, 0};
      if (n.kind == NodeKind::kConst) {
        cell.bits = n.type == Type::kBool || n.type == Type::kI64 ? CellBits(n.type, n.i)
                                                                  : CellBits(n.type, n.f);
      }
      instr.a = static_cast<int32_t>(unit.cells.size());
      unit.cells.push_back(cell);
    }
    if (uniform[i]) {
      instr.dst = new_slot();
      unit.prologue.push_back(instr);
    } else {
      if (free_slots.empty()) {
        instr.dst = new_slot();
      } else {
        instr.dst = free_slots.back();
        free_slots.pop_back();
      }
      unit.body.push_back(instr);
      for (size_t k = 0; k < n.args.size(); ++k) {
        const int32_t a = n.args[k];
        const bool repeated =
            std::find(n.args.begin(), n.args.begin() + k, a) != n.args.begin() + k;
        const NodeKind kind = p.nodes[a].kind;
        if (!repeated && !uniform[a] && kind != NodeKind::kInput && kind != NodeKind::kReduced &&
            last_use[a] == i) {
          free_slots.push_back(slot_of[a]);
        }
      }
    }
    slot_of[i] = instr.dst;
  }
  for (int32_t r : roots) unit.results.push_back(slot_of[r]);

  const int64_t slots = std::max<int32_t>(unit.slots, 1);
  while (unit.chunk > 64 && slots * unit.chunk * 8 > kRegisterBudget) unit.chunk /= 2;
  const int64_t cost = static_cast<int64_t>(unit.body.size() + unit.loads.size() + roots.size());
  unit.task_elements = std::clamp(FloorPowerOfTwo(std::max<int64_t>(1, kTaskWork / cost)),
                                  unit.chunk, kMaxTaskElements);
  return unit;
}

// ---- running ---------------------------------------------------------------------------------

/// A task's registers: one chunk per slot, allocated once per task.
class Scratch {
 public:
  explicit Scratch(const Unit& unit)
      : chunk_bytes_(unit.chunk * 8),
        memory_(std::make_unique_for_overwrite<double[]>(
            static_cast<size_t>(std::max<int32_t>(unit.slots, 1) * unit.chunk + 8))),
        slots_(static_cast<size_t>(unit.slots)) {
    // Align to 64 bytes for the vector loops.
    auto address = reinterpret_cast<uintptr_t>(memory_.get());
    base_ = reinterpret_cast<char*>(memory_.get()) + ((64 - address % 64) % 64);
    for (size_t s = 0; s < slots_.size(); ++s) slots_[s] = Owned(static_cast<int32_t>(s));
  }

  /// The slot's own chunk, made current.
  void* Own(int32_t slot) { return slots_[slot] = Owned(slot); }
  /// Makes the slot read `data` (a tensor's memory of the compute type) for this chunk.
  void Point(int32_t slot, const void* data) { slots_[slot] = const_cast<void*>(data); }
  const void* Current(int32_t slot) const { return slots_[slot]; }
  vm::Frame FrameWith(const std::vector<uint64_t>& cells) const {
    return {slots_.data(), cells.data()};
  }

 private:
  void* Owned(int32_t slot) const { return base_ + slot * chunk_bytes_; }

  int64_t chunk_bytes_;
  std::unique_ptr<double[]> memory_;
  char* base_ = nullptr;
  std::vector<void*> slots_;
};

void Exec(const std::vector<Instr>& code, const vm::Frame& frame, int64_t n) {
  for (const Instr& instr : code) instr.fn(instr, frame, n);
}

/// A load bound to this launch's tensor and iteration space.
struct BoundLoad {
  enum class Mode { kContiguous, kScalar, kStrided };
  vm::LoadFn fn = nullptr;
  const char* data = nullptr;
  int64_t element_bytes = 0;  // of the dtype
  int64_t compute_bytes = 0;  // of the compute type
  bool in_place = false;
  int32_t slot = 0;
  Mode mode = Mode::kStrided;
  std::vector<int64_t> strides;  // over the space's dims
};

/// Flattened iteration space: row-major `dims` (never empty) with each input's strides.
struct Space {
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides;  // per input operand
};

BoundLoad Bind(DType dtype, const void* data, int32_t slot, std::vector<int64_t> strides,
               const std::vector<int64_t>& dims) {
  BoundLoad l;
  l.fn = vm::SelectLoad(dtype);
  l.data = static_cast<const char*>(data);
  l.element_bytes = static_cast<int64_t>(DTypeSize(dtype));
  l.compute_bytes = vm::WithType(
      ComputeType(dtype), [](auto tag) { return int64_t{sizeof(typename decltype(tag)::type)}; },
      int64_t{8});
  l.in_place = vm::LoadsInPlace(dtype);
  l.slot = slot;
  if (std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s == 0; })) {
    l.mode = BoundLoad::Mode::kScalar;
  } else if (strides == ContiguousStrides(dims)) {
    l.mode = BoundLoad::Mode::kContiguous;
  }
  l.strides = std::move(strides);
  return l;
}

/// Loads elements [p, p + n) of the space into the load's slot. Scalar loads are done once per
/// task (LoadScalars).
void LoadChunk(const BoundLoad& l, const std::vector<int64_t>& dims, int64_t p, int64_t n,
               Scratch& scratch) {
  if (l.mode == BoundLoad::Mode::kScalar) return;
  if (l.mode == BoundLoad::Mode::kContiguous) {
    if (l.in_place) {
      scratch.Point(l.slot, l.data + p * l.element_bytes);
    } else {
      l.fn(l.data, p, 1, scratch.Own(l.slot), n);
    }
    return;
  }
  // An odometer over the dimensions, one run of the innermost at a time.
  const size_t rank = dims.size();
  std::array<int64_t, kMaxRank> index{};
  int64_t offset = 0;
  int64_t rest = p;
  for (size_t d = rank; d-- > 0;) {
    index[d] = rest % dims[d];
    rest /= dims[d];
    offset += index[d] * l.strides[d];
  }
  char* dst = static_cast<char*>(scratch.Own(l.slot));
  const int64_t inner = dims[rank - 1];
  const int64_t inner_stride = l.strides[rank - 1];
  for (int64_t done = 0; done < n;) {
    const int64_t run = std::min(inner - index[rank - 1], n - done);
    l.fn(l.data, offset, inner_stride, dst + done * l.compute_bytes, run);
    done += run;
    offset += run * inner_stride;
    index[rank - 1] += run;
    for (size_t d = rank - 1; d > 0 && index[d] == dims[d]; --d) {
      offset += l.strides[d - 1] - dims[d] * l.strides[d];
      index[d] = 0;
      ++index[d - 1];
    }
  }
}

void LoadScalars(const std::vector<BoundLoad>& loads, int64_t chunk, Scratch& scratch) {
  for (const BoundLoad& l : loads) {
    if (l.mode == BoundLoad::Mode::kScalar) l.fn(l.data, 0, 0, scratch.Own(l.slot), chunk);
  }
}

/// Runs `unit` over elements [begin, end) of `space`, a chunk at a time, in a task's own
/// registers: the prologue and the scalar loads once, then per chunk the loads, the body, and
/// `use_chunk(scratch, p, m)`, which takes the results of elements [p, p + m) from `scratch`.
template <typename UseChunk>
void RunChunks(const Unit& unit, const Space& space, const std::vector<BoundLoad>& loads,
               const std::vector<uint64_t>& cells, int64_t begin, int64_t end,
               UseChunk&& use_chunk) {
  Scratch scratch(unit);
  const vm::Frame frame = scratch.FrameWith(cells);
  Exec(unit.prologue, frame, unit.chunk);
  LoadScalars(loads, unit.chunk, scratch);
  for (int64_t p = begin; p < end; p += unit.chunk) {
    const int64_t m = std::min(unit.chunk, end - p);
    for (const BoundLoad& l : loads) LoadChunk(l, space.dims, p, m, scratch);
    Exec(unit.body, frame, m);
    use_chunk(scratch, p, m);
  }
}

/// Broadcast strides (0 where broadcast) of each input over `shape`.
std::vector<std::vector<int64_t>> BroadcastStrides(const Shape& shape,
                                                   const std::vector<Shape>& ins) {
  std::vector<std::vector<int64_t>> strides;
  for (const Shape& in : ins) {
    std::vector<int64_t> s(shape.size(), 0);
    int64_t stride = 1;
    for (size_t i = in.size(); i-- > 0;) {
      const size_t d = shape.size() - in.size() + i;
      s[d] = in[i] == 1 && shape[d] != 1 ? 0 : stride;
      stride *= in[i];
    }
    strides.push_back(std::move(s));
  }
  return strides;
}

/// The reduction's space: the broadcast shape's kept dimensions, then its reduced ones
/// (size-1 dimensions dropped, neighbours merged where every input walks them contiguously),
/// so element k * reduced + r is the r-th reduced element (row-major over the reduced
/// dimensions) of the k-th kept one (row-major: the output's order).
Space ReduceSpace(const Shape& shape, const std::vector<bool>& reduced,
                  const std::vector<Shape>& ins) {
  const std::vector<std::vector<int64_t>> full = BroadcastStrides(shape, ins);
  Space space;
  space.strides.resize(ins.size());
  for (bool pass : {false, true}) {
    for (size_t d = 0; d < shape.size(); ++d) {
      if (reduced[d] != pass || shape[d] == 1) continue;
      bool merge = !space.dims.empty();
      for (size_t k = 0; merge && k < ins.size(); ++k) {
        merge = space.strides[k].back() == full[k][d] * shape[d];
      }
      if (merge) {
        space.dims.back() *= shape[d];
      } else {
        space.dims.push_back(shape[d]);
      }
      for (size_t k = 0; k < ins.size(); ++k) {
        if (merge) {
          space.strides[k].back() = full[k][d];
        } else {
          space.strides[k].push_back(full[k][d]);
        }
      }
    }
  }
  if (space.dims.empty()) {
    space.dims.push_back(1);
    for (auto& s : space.strides) s.push_back(0);
  }
  return space;
}

const AttrValue* FindAttr(const Attrs& attrs, absl::string_view name) {
  auto it = attrs.find(name);
  return it == attrs.end() ? nullptr : &it->second;
}

/// A launch's parameter value: a float parameter is a double, an int parameter an int64_t.
using ParamValue = std::variant<double, int64_t>;

class CompiledProgram final : public CpuProgram {
 public:
  CompiledProgram(const Program& program, Unit main, std::optional<Unit> post,
                  std::optional<vm::FoldOps> fold, std::vector<vm::StoreFn> stores)
      : definition_(program.definition),
        reduction_(program.reduction),
        map_type_(program.reduction ? program.nodes[program.reduction->map].type : Type::kF32),
        main_(std::move(main)),
        post_(std::move(post)),
        fold_(fold),
        stores_(std::move(stores)) {}

  absl::Status Run(const Plan& plan, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs, Parallel& parallel) const override;

 private:
  absl::Status CheckPlan(const Plan& plan, const std::vector<const void*>& inputs,
                         const std::vector<void*>& outputs) const;
  absl::StatusOr<std::vector<ParamValue>> Params(const Attrs& attrs) const;
  std::vector<uint64_t> Cells(const Unit& unit, const std::vector<ParamValue>& params,
                              int64_t count) const;
  std::vector<BoundLoad> BindLoads(const Unit& unit, const Space& space,
                                   const std::vector<const void*>& inputs) const;
  absl::Status RunElementwise(const Plan& plan, const std::vector<const void*>& inputs,
                              const std::vector<void*>& outputs,
                              const std::vector<ParamValue>& params, Parallel& parallel) const;
  absl::Status RunReduction(const Plan& plan, const std::vector<const void*>& inputs, void* output,
                            const std::vector<ParamValue>& params, Parallel& parallel) const;

  Definition definition_;
  std::optional<Reduction> reduction_;
  Type map_type_;             // the reduction's map values
  Unit main_;                 // the elementwise results, or the reduction's map
  std::optional<Unit> post_;  // the reduction's post-expression
  std::optional<vm::FoldOps> fold_;
  std::vector<vm::StoreFn> stores_;  // per output, from its root's type
};

absl::Status CompiledProgram::CheckPlan(const Plan& plan, const std::vector<const void*>& inputs,
                                        const std::vector<void*>& outputs) const {
  auto error = [&](absl::string_view what) {
    return absl::InternalError(
        absl::StrCat("kernel ", definition_.name, ": the plan does not match the program: ", what));
  };
  if (plan.inputs.size() != definition_.inputs.size() || inputs.size() != plan.inputs.size() ||
      plan.outputs.size() != definition_.outputs.size() || outputs.size() != plan.outputs.size()) {
    return error("operand counts differ");
  }
  for (size_t k = 0; k < plan.inputs.size(); ++k) {
    if (plan.inputs[k].dtype != definition_.inputs[k].dtype ||
        plan.inputs[k].shape.size() > kMaxRank) {
      return error(absl::StrCat("input ", k, " has another dtype or too high a rank"));
    }
    if (inputs[k] == nullptr && CheckedNumElements(plan.inputs[k].shape) != 0) {
      return error(absl::StrCat("input ", k, " has no buffer"));
    }
  }
  for (size_t k = 0; k < plan.outputs.size(); ++k) {
    if (plan.outputs[k].dtype != definition_.outputs[k].dtype ||
        plan.outputs[k].shape.size() > kMaxRank) {
      return error(absl::StrCat("output ", k, " has another dtype or too high a rank"));
    }
    if (outputs[k] == nullptr && CheckedNumElements(plan.outputs[k].shape) != 0) {
      return error(absl::StrCat("output ", k, " has no buffer"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ParamValue>> CompiledProgram::Params(const Attrs& attrs) const {
  std::vector<ParamValue> values;
  for (const ScalarDef& def : definition_.params) {
    const AttrValue* attr = FindAttr(attrs, def.name);
    double f = 0;
    int64_t i = 0;
    if (attr == nullptr) {
      if (!def.default_value.has_value()) {
        return absl::InternalError(absl::StrCat("kernel ", definition_.name, ": parameter ",
                                                def.name, " has no value in the plan"));
      }
      f = *def.default_value;
      i = semantics::FloatToInt<int64_t>(f);
    } else if (const auto* d = std::get_if<double>(attr)) {
      f = *d;
      i = semantics::FloatToInt<int64_t>(f);
    } else if (const auto* n = std::get_if<int64_t>(attr)) {
      i = *n;
      f = static_cast<double>(i);
    } else {
      return absl::InternalError(absl::StrCat("kernel ", definition_.name, ": parameter ", def.name,
                                              " is not a number in the plan"));
    }
    values.push_back(def.kind == ScalarKind::kInt ? ParamValue(i) : ParamValue(f));
  }
  return values;
}

std::vector<uint64_t> CompiledProgram::Cells(const Unit& unit,
                                             const std::vector<ParamValue>& params,
                                             int64_t count) const {
  std::vector<uint64_t> cells;
  cells.reserve(unit.cells.size());
  for (const Cell& cell : unit.cells) {
    switch (cell.kind) {
      case NodeKind::kParam:
        cells.push_back(
            std::visit([&](auto v) { return CellBits(cell.type, v); }, params[cell.param]));
        break;
      case NodeKind::kCount:
        cells.push_back(CellBits(cell.type, count));
        break;
      default:
        cells.push_back(cell.bits);
        break;
    }
  }
  return cells;
}

std::vector<BoundLoad> CompiledProgram::BindLoads(const Unit& unit, const Space& space,
                                                  const std::vector<const void*>& inputs) const {
  std::vector<BoundLoad> loads;
  for (const Load& load : unit.loads) {
    if (load.operand == kReducedOperand) continue;  // filled by the fold
    loads.push_back(Bind(definition_.inputs[load.operand].dtype, inputs[load.operand], load.slot,
                         space.strides[load.operand], space.dims));
  }
  return loads;
}

absl::Status CompiledProgram::Run(const Plan& plan, const std::vector<const void*>& inputs,
                                  const std::vector<void*>& outputs, Parallel& parallel) const {
  if (absl::Status s = CheckPlan(plan, inputs, outputs); !s.ok()) return s;
  absl::StatusOr<std::vector<ParamValue>> params = Params(plan.attrs);
  if (!params.ok()) return params.status();
  if (reduction_.has_value()) return RunReduction(plan, inputs, outputs[0], *params, parallel);
  return RunElementwise(plan, inputs, outputs, *params, parallel);
}

absl::Status CompiledProgram::RunElementwise(const Plan& plan,
                                             const std::vector<const void*>& inputs,
                                             const std::vector<void*>& outputs,
                                             const std::vector<ParamValue>& params,
                                             Parallel& parallel) const {
  // Step 1: the geometry every output shares.
  const Shape& shape = plan.outputs[0].shape;
  std::vector<Shape> in_shapes;
  for (const TensorMeta& in : plan.inputs) {
    absl::StatusOr<Shape> b = BroadcastShapes(in.shape, shape);
    if (!b.ok() || *b != shape) {
      return absl::InternalError(absl::StrCat("kernel ", definition_.name, ": input ",
                                              MetaString(in), " does not broadcast to ",
                                              ShapeString(shape)));
    }
    in_shapes.push_back(in.shape);
  }
  for (const TensorMeta& out : plan.outputs) {
    if (out.shape != shape) {
      return absl::InternalError(
          absl::StrCat("kernel ", definition_.name, ": outputs have different shapes"));
    }
  }
  const int64_t n = CheckedNumElements(shape);
  if (n == 0) return absl::OkStatus();
  BroadcastGeometry g = MakeBroadcast(shape, in_shapes);
  const Space space{std::move(g.shape), std::move(g.strides)};
  const std::vector<BoundLoad> loads = BindLoads(main_, space, inputs);
  const std::vector<uint64_t> cells = Cells(main_, params, 0);

  // Step 2: tasks of whole chunks; per chunk: load, compute, store.
  parallel.For(n, main_.task_elements, [&](int64_t begin, int64_t end) {
    RunChunks(main_, space, loads, cells, begin, end,
              [&](const Scratch& scratch, int64_t p, int64_t m) {
                for (size_t k = 0; k < outputs.size(); ++k) {
                  stores_[k](scratch.Current(main_.results[k]), outputs[k], p, m);
                }
              });
  });
  return absl::OkStatus();
}

absl::Status CompiledProgram::RunReduction(const Plan& plan, const std::vector<const void*>& inputs,
                                           void* output, const std::vector<ParamValue>& params,
                                           Parallel& parallel) const {
  auto error = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat("kernel ", definition_.name, ": ", what));
  };
  // Step 1: the broadcast shape, the reduced dimensions and the output shape they imply.
  Shape shape;
  std::vector<Shape> in_shapes;
  for (const TensorMeta& in : plan.inputs) {
    absl::StatusOr<Shape> b = BroadcastShapes(shape, in.shape);
    if (!b.ok()) return error("inputs do not broadcast");
    shape = *std::move(b);
    in_shapes.push_back(in.shape);
  }
  const auto rank = static_cast<int64_t>(shape.size());
  std::vector<bool> reduced(shape.size(), false);
  const AttrValue* axes_attr = FindAttr(plan.attrs, "axes");
  const auto* axes = axes_attr == nullptr ? nullptr : std::get_if<std::vector<int64_t>>(axes_attr);
  if (axes == nullptr || axes->empty()) {
    reduced.assign(shape.size(), true);
  } else {
    for (int64_t a : *axes) {
      if (a < -rank || a >= rank) return error("an axis is out of range");
      reduced[a < 0 ? a + rank : a] = true;
    }
  }
  const AttrValue* keep_attr = FindAttr(plan.attrs, "keepdims");
  const bool keepdims =
      keep_attr != nullptr && std::get_if<bool>(keep_attr) != nullptr && std::get<bool>(*keep_attr);
  Shape expected;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d]) {
      expected.push_back(shape[d]);
    } else if (keepdims) {
      expected.push_back(1);
    }
  }
  if (plan.outputs[0].shape != expected) {
    return error(absl::StrCat("the output shape is ", ShapeString(plan.outputs[0].shape),
                              ", the reduction's is ", ShapeString(expected)));
  }
  int64_t kept = 1;
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) (reduced[d] ? count : kept) *= shape[d];
  if (kept == 0) return absl::OkStatus();

  const Space space = ReduceSpace(shape, reduced, in_shapes);
  const std::vector<BoundLoad> loads = BindLoads(main_, space, inputs);
  const std::vector<uint64_t> map_cells = Cells(main_, params, count);
  const std::vector<uint64_t> post_cells = Cells(*post_, params, count);
  const vm::FoldOps& fold = *fold_;
  const int32_t reduced_slot = post_->loads.empty() ? -1 : post_->loads[0].slot;
  const int64_t value_bytes = vm::WithType(
      map_type_, [](auto tag) { return int64_t{sizeof(typename decltype(tag)::type)}; },
      int64_t{8});

  // Folds elements [begin, end) of the space into accs[k - first_kept] for kept element k.
  auto map = [&](int64_t begin, int64_t end, vm::Acc* accs, int64_t first_kept) {
    RunChunks(main_, space, loads, map_cells, begin, end,
              [&](const Scratch& scratch, int64_t p, int64_t m) {
                const char* values = static_cast<const char*>(scratch.Current(main_.results[0]));
                for (int64_t q = p; q < p + m;) {  // one run per kept element
                  const int64_t k = q / count;
                  const int64_t r = q % count;
                  const int64_t run = std::min(count - r, p + m - q);
                  fold.run(values + (q - p) * value_bytes, run, r, accs[k - first_kept]);
                  q += run;
                }
              });
  };
  // Evaluates the post-expression of kept elements [begin, end) and stores them.
  auto finish = [&](int64_t begin, int64_t end, const vm::Acc* accs) {
    Scratch scratch(*post_);
    const vm::Frame frame = scratch.FrameWith(post_cells);
    Exec(post_->prologue, frame, post_->chunk);
    for (int64_t p = begin; p < end; p += post_->chunk) {
      const int64_t m = std::min(post_->chunk, end - p);
      if (reduced_slot >= 0) {
        void* combined = scratch.Own(reduced_slot);
        for (int64_t i = 0; i < m; ++i) fold.finish(accs[p - begin + i], combined, i);
      }
      Exec(post_->body, frame, m);
      stores_[0](scratch.Current(post_->results[0]), output, p, m);
    }
  };

  // Step 2: whole reductions per task, or, for long ones, fixed parts combined in order.
  const int64_t part = main_.task_elements;
  if (count <= part) {
    const int64_t grain = std::max<int64_t>(1, part / std::max<int64_t>(count, 1));
    parallel.For(kept, grain, [&](int64_t begin, int64_t end) {
      std::vector<vm::Acc> accs(static_cast<size_t>(end - begin), fold.init);
      if (count > 0) map(begin * count, end * count, accs.data(), begin);
      finish(begin, end, accs.data());
    });
    return absl::OkStatus();
  }
  const int64_t parts = (count + part - 1) / part;
  std::vector<vm::Acc> partials(static_cast<size_t>(kept * parts), fold.init);
  parallel.For(kept * parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t k = t / parts;
      const int64_t first = k * count + (t % parts) * part;
      map(first, std::min(first + part, (k + 1) * count), &partials[t], k);
    }
  });
  parallel.For(kept, post_->task_elements, [&](int64_t begin, int64_t end) {
    std::vector<vm::Acc> accs(static_cast<size_t>(end - begin));
    for (int64_t k = begin; k < end; ++k) {
      vm::Acc& acc = accs[k - begin];
      acc = partials[k * parts];
      for (int64_t j = 1; j < parts; ++j) fold.merge(acc, partials[k * parts + j]);
    }
    finish(begin, end, accs.data());
  });
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<const CpuProgram>> CpuProgram::Build(const Program& program) {
  auto error = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat("kernel ", program.definition.name, ": ", what));
  };
  const size_t count = program.nodes.size();
  auto valid = [&](int32_t node) { return node >= 0 && static_cast<size_t>(node) < count; };
  if (program.results.size() != program.definition.outputs.size() ||
      !std::all_of(program.results.begin(), program.results.end(), valid)) {
    return error("results do not match the outputs");
  }
  std::vector<vm::StoreFn> stores;
  for (size_t k = 0; k < program.results.size(); ++k) {
    stores.push_back(vm::SelectStore(program.nodes[program.results[k]].type,
                                     program.definition.outputs[k].dtype));
    if (stores.back() == nullptr) return error("a result has an unknown type");
  }
  if (!program.reduction.has_value()) {
    absl::StatusOr<Unit> main = CompileUnit(program, program.results, Part::kElementwise);
    if (!main.ok()) return main.status();
    return std::make_unique<const CompiledProgram>(program, *std::move(main), std::nullopt,
                                                   std::nullopt, std::move(stores));
  }
  const Reduction& r = *program.reduction;
  if (program.results.size() != 1 || !valid(r.map)) return error("a malformed reduction");
  std::optional<vm::FoldOps> fold =
      vm::SelectFold(r.combine, program.nodes[r.map].type, r.accumulate);
  if (!fold.has_value()) return error("a combine its types do not have");
  absl::StatusOr<Unit> map = CompileUnit(program, {r.map}, Part::kMap);
  if (!map.ok()) return map.status();
  absl::StatusOr<Unit> post = CompileUnit(program, program.results, Part::kPost);
  if (!post.ok()) return post.status();
  return std::make_unique<const CompiledProgram>(program, *std::move(map), *std::move(post), fold,
                                                 std::move(stores));
}

}  // namespace tessera::kernels::expr
