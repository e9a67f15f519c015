#include "kernels/cpu/cpu_kernels.h"

#include <mutex>
#include <string>
#include <unordered_map>

#include <cblas.h>

#include "absl/strings/str_cat.h"

#include "kernels/cpu/kernels_internal.h"

namespace tessera::kernels {
namespace {

using Inputs = std::vector<const void*>;
using Outputs = std::vector<void*>;
using Runner = void (*)(const Plan&, const Inputs&, const Outputs&, Parallel&);

#define TESSERA_UNARY(op)                                                  \
  [](const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) { \
    cpu::RunUnary(cpu::UnaryOp::op, p, in[0], out[0], par);                \
  }
#define TESSERA_BINARY(op)                                                 \
  [](const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) { \
    cpu::RunBinary(cpu::BinaryOp::op, p, in[0], in[1], out[0], par);       \
  }
#define TESSERA_REDUCE(op)                                                 \
  [](const Plan& p, const Inputs& in, const Outputs& out, Parallel& par) { \
    cpu::RunReduce(cpu::ReduceOp::op, p, in[0], out[0], par);              \
  }

const std::unordered_map<std::string, Runner>& Runners() {
  static const auto* runners = new std::unordered_map<std::string, Runner>{
      {"fill", [](const Plan& p, const Inputs&, const Outputs& out,
                  Parallel& par) { cpu::RunFill(p, out[0], par); }},
      {"copy", [](const Plan& p, const Inputs& in, const Outputs& out,
                  Parallel& par) { cpu::RunCopy(p, in[0], out[0], par); }},
      {"cast", [](const Plan& p, const Inputs& in, const Outputs& out,
                  Parallel& par) { cpu::RunCast(p, in[0], out[0], par); }},
      {"neg", TESSERA_UNARY(kNeg)},
      {"abs", TESSERA_UNARY(kAbs)},
      {"relu", TESSERA_UNARY(kRelu)},
      {"exp", TESSERA_UNARY(kExp)},
      {"log", TESSERA_UNARY(kLog)},
      {"sqrt", TESSERA_UNARY(kSqrt)},
      {"rsqrt", TESSERA_UNARY(kRsqrt)},
      {"gelu", TESSERA_UNARY(kGelu)},
      {"sigmoid", TESSERA_UNARY(kSigmoid)},
      {"tanh", TESSERA_UNARY(kTanh)},
      {"scale", TESSERA_UNARY(kScale)},
      {"add", TESSERA_BINARY(kAdd)},
      {"sub", TESSERA_BINARY(kSub)},
      {"mul", TESSERA_BINARY(kMul)},
      {"div", TESSERA_BINARY(kDiv)},
      {"maximum", TESSERA_BINARY(kMaximum)},
      {"minimum", TESSERA_BINARY(kMinimum)},
      {"pow", TESSERA_BINARY(kPow)},
      {"sum", TESSERA_REDUCE(kSum)},
      {"mean", TESSERA_REDUCE(kMean)},
      {"max", TESSERA_REDUCE(kMax)},
      {"min", TESSERA_REDUCE(kMin)},
      {"argmax", [](const Plan& p, const Inputs& in, const Outputs& out,
                    Parallel& par) { cpu::RunArgmax(p, in[0], out[0], par); }},
      {"softmax", [](const Plan& p, const Inputs& in, const Outputs& out,
                     Parallel& par) { cpu::RunSoftmax(false, p, in[0], out[0], par); }},
      {"log_softmax", [](const Plan& p, const Inputs& in, const Outputs& out,
                         Parallel& par) { cpu::RunSoftmax(true, p, in[0], out[0], par); }},
      {"layer_norm", [](const Plan& p, const Inputs& in, const Outputs& out,
                        Parallel& par) { cpu::RunNorm(false, p, in, out[0], par); }},
      {"rms_norm", [](const Plan& p, const Inputs& in, const Outputs& out,
                      Parallel& par) { cpu::RunNorm(true, p, in, out[0], par); }},
      {"transpose", [](const Plan& p, const Inputs& in, const Outputs& out,
                       Parallel& par) { cpu::RunTranspose(p, in[0], out[0], par); }},
      {"matmul", [](const Plan& p, const Inputs& in, const Outputs& out,
                    Parallel& par) { cpu::RunMatmul(p, in[0], in[1], out[0], par); }},
  };
  return *runners;
}

#undef TESSERA_UNARY
#undef TESSERA_BINARY
#undef TESSERA_REDUCE

}  // namespace

absl::Status RunCpuKernel(const Plan& plan, const std::vector<const void*>& inputs,
                          const std::vector<void*>& outputs, Parallel& parallel) {
  auto it = Runners().find(plan.kernel->name);
  if (it == Runners().end()) {
    return absl::InternalError(
        absl::StrCat("the CPU backend has no implementation of kernel ", plan.kernel->name));
  }
  if (inputs.size() != plan.inputs.size() || outputs.size() != plan.outputs.size()) {
    return absl::InternalError(absl::StrCat("kernel ", plan.kernel->name, " got ", inputs.size(),
                                            " input and ", outputs.size(),
                                            " output buffers for its plan"));
  }
  it->second(plan, inputs, outputs, parallel);
  return absl::OkStatus();
}

void InitCpuKernels() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace tessera::kernels
