#include "kernels/cpu/cpu_kernels.h"

#include <mutex>

#include <cblas.h>

#include "absl/strings/str_cat.h"

#include "kernels/cpu/kernels_internal.h"
#include "kernels/expr/user_kernel.h"

namespace tessera::kernels {
namespace {

using Inputs = std::vector<const void*>;
using Outputs = std::vector<void*>;
using Runner = void (*)(const Plan&, const Inputs&, const Outputs&, Parallel&);

void Fill(const Plan& p, const Inputs&, const Outputs& out, Parallel& par) {
  cpu::RunFill(p, out[0], par);
}
void Copy(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunCopy(p, in[0], out[0], par);
}
void Cast(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunCast(p, in[0], out[0], par);
}
template <cpu::UnaryOp kOp>
void Unary(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunUnary(kOp, p, in[0], out[0], par);
}
template <cpu::BinaryOp kOp>
void Binary(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunBinary(kOp, p, in[0], in[1], out[0], par);
}
template <cpu::ReduceOp kOp>
void Reduce(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunReduce(kOp, p, in[0], out[0], par);
}
void Argmax(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunArgmax(p, in[0], out[0], par);
}
template <bool kLog>
void Softmax(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunSoftmax(kLog, p, in[0], out[0], par);
}
template <bool kRms>
void Norm(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunNorm(kRms, p, in, out[0], par);
}
void Transpose(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunTranspose(p, in[0], out[0], par);
}
void Matmul(const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) {
  cpu::RunMatmul(p, in[0], in[1], out[0], par);
}

// The CPU backend's dispatch: every op to its implementation, or nullptr where it has none
// (which CpuImplements reports, and the catalog test refuses).
Runner RunnerFor(Op op) {
  switch (op) {
    case Op::kFill:
      return Fill;
    case Op::kCopy:
      return Copy;
    case Op::kCast:
      return Cast;
    case Op::kNeg:
      return Unary<cpu::UnaryOp::kNeg>;
    case Op::kAbs:
      return Unary<cpu::UnaryOp::kAbs>;
    case Op::kRelu:
      return Unary<cpu::UnaryOp::kRelu>;
    case Op::kExp:
      return Unary<cpu::UnaryOp::kExp>;
    case Op::kLog:
      return Unary<cpu::UnaryOp::kLog>;
    case Op::kSqrt:
      return Unary<cpu::UnaryOp::kSqrt>;
    case Op::kRsqrt:
      return Unary<cpu::UnaryOp::kRsqrt>;
    case Op::kGelu:
      return Unary<cpu::UnaryOp::kGelu>;
    case Op::kSigmoid:
      return Unary<cpu::UnaryOp::kSigmoid>;
    case Op::kTanh:
      return Unary<cpu::UnaryOp::kTanh>;
    case Op::kScale:
      return Unary<cpu::UnaryOp::kScale>;
    case Op::kAdd:
      return Binary<cpu::BinaryOp::kAdd>;
    case Op::kSub:
      return Binary<cpu::BinaryOp::kSub>;
    case Op::kMul:
      return Binary<cpu::BinaryOp::kMul>;
    case Op::kDiv:
      return Binary<cpu::BinaryOp::kDiv>;
    case Op::kMaximum:
      return Binary<cpu::BinaryOp::kMaximum>;
    case Op::kMinimum:
      return Binary<cpu::BinaryOp::kMinimum>;
    case Op::kPow:
      return Binary<cpu::BinaryOp::kPow>;
    case Op::kSum:
      return Reduce<cpu::ReduceOp::kSum>;
    case Op::kMean:
      return Reduce<cpu::ReduceOp::kMean>;
    case Op::kMax:
      return Reduce<cpu::ReduceOp::kMax>;
    case Op::kMin:
      return Reduce<cpu::ReduceOp::kMin>;
    case Op::kArgmax:
      return Argmax;
    case Op::kSoftmax:
      return Softmax<false>;
    case Op::kLogSoftmax:
      return Softmax<true>;
    case Op::kLayerNorm:
      return Norm<false>;
    case Op::kRmsNorm:
      return Norm<true>;
    case Op::kTranspose:
      return Transpose;
    case Op::kMatmul:
      return Matmul;
    case Op::kUser:
      return nullptr;  // not a catalog op: RunCpuKernel runs the plan's own program
  }
  return nullptr;  // not an Op
}

}  // namespace

bool CpuImplements(Op op) { return RunnerFor(op) != nullptr; }

absl::Status RunCpuKernel(const Plan& plan, const std::vector<const void*>& inputs,
                          const std::vector<void*>& outputs, Parallel& parallel) {
  if (plan.kernel->op == Op::kUser) {
    if (plan.user == nullptr || plan.user->cpu == nullptr) {
      return absl::InternalError(
          absl::StrCat("kernel ", plan.kernel->name, " has no compiled CPU program"));
    }
    return plan.user->cpu->Run(plan, inputs, outputs, parallel);
  }
  const Runner run = RunnerFor(plan.kernel->op);
  if (run == nullptr) {
    return absl::InternalError(
        absl::StrCat("the CPU backend has no implementation of kernel ", plan.kernel->name));
  }
  if (inputs.size() != plan.inputs.size() || outputs.size() != plan.outputs.size()) {
    return absl::InternalError(absl::StrCat("kernel ", plan.kernel->name, " got ", inputs.size(),
                                            " input and ", outputs.size(),
                                            " output buffers for its plan"));
  }
  run(plan, inputs, outputs, parallel);
  return absl::OkStatus();
}

void InitCpuKernels() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace tessera::kernels
