#ifndef TESSERA_KERNELS_CPU_KERNELS_INTERNAL_H_
#define TESSERA_KERNELS_CPU_KERNELS_INTERNAL_H_

// Entry points of the CPU kernel families, called by RunCpuKernel's switch over Op.
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/geometry.h"
#include "kernels/registry.h"

namespace tessera::kernels::cpu {

enum class UnaryOp { kNeg, kAbs, kRelu, kExp, kLog, kSqrt, kRsqrt, kGelu, kSigmoid, kTanh, kScale };
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kMaximum, kMinimum, kPow };
enum class ReduceOp { kSum, kMean, kMax, kMin };

void RunFill(const Plan& plan, void* out, Parallel& parallel);
void RunCopy(const Plan& plan, const void* in, void* out, Parallel& parallel);
void RunCast(const Plan& plan, const void* in, void* out, Parallel& parallel);
void RunUnary(UnaryOp op, const Plan& plan, const void* in, void* out, Parallel& parallel);
void RunBinary(BinaryOp op, const Plan& plan, const void* a, const void* b, void* out,
               Parallel& parallel);
void RunReduce(ReduceOp op, const Plan& plan, const void* in, void* out, Parallel& parallel);
void RunArgmax(const Plan& plan, const void* in, void* out, Parallel& parallel);
void RunSoftmax(bool log, const Plan& plan, const void* in, void* out, Parallel& parallel);
void RunNorm(bool rms, const Plan& plan, const std::vector<const void*>& in, void* out,
             Parallel& parallel);
void RunTranspose(const Plan& plan, const void* in, void* out, Parallel& parallel);
void RunMatmul(const Plan& plan, const void* a, const void* b, void* out, Parallel& parallel);

}  // namespace tessera::kernels::cpu

#endif  // TESSERA_KERNELS_CPU_KERNELS_INTERNAL_H_
