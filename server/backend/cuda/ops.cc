#include "server/backend/cuda/ops.h"

#include "absl/strings/str_cat.h"

#include "kernels/cuda/params.h"

namespace tessera::cuda {
namespace {

namespace tc = ::tessera_cuda;
using kernels::DType;
using kernels::Op;

// In place is safe where each element is read and written by one thread: the element-wise
// kernels, and softmax (its block reductions read the row before the final pass writes it).
constexpr bool kAliasSafe = true;
constexpr bool kStaged = false;

// Entry points are instantiated per dtype; bool shares u8's.
std::string Suffix(DType dtype) {
  return dtype == DType::kBool ? "u8" : std::string(kernels::DTypeName(dtype));
}

}  // namespace

CudaImpl CudaImplOf(Op op) {
  using L = CudaLauncher;
  switch (op) {
    case Op::kFill:
      return {L::kFill, 0, kStaged};
    case Op::kCopy:
      return {L::kCopy, 0, kAliasSafe};
    case Op::kCast:
      return {L::kCast, 0, kAliasSafe};
    case Op::kNeg:
      return {L::kUnary, tc::kNeg, kAliasSafe};
    case Op::kAbs:
      return {L::kUnary, tc::kAbs, kAliasSafe};
    case Op::kRelu:
      return {L::kUnary, tc::kRelu, kAliasSafe};
    case Op::kExp:
      return {L::kUnary, tc::kExp, kAliasSafe};
    case Op::kLog:
      return {L::kUnary, tc::kLog, kAliasSafe};
    case Op::kSqrt:
      return {L::kUnary, tc::kSqrt, kAliasSafe};
    case Op::kRsqrt:
      return {L::kUnary, tc::kRsqrt, kAliasSafe};
    case Op::kGelu:
      return {L::kUnary, tc::kGelu, kAliasSafe};
    case Op::kSigmoid:
      return {L::kUnary, tc::kSigmoid, kAliasSafe};
    case Op::kTanh:
      return {L::kUnary, tc::kTanh, kAliasSafe};
    case Op::kScale:
      return {L::kUnary, tc::kScale, kAliasSafe};
    case Op::kAdd:
      return {L::kBinary, tc::kAdd, kAliasSafe};
    case Op::kSub:
      return {L::kBinary, tc::kSub, kAliasSafe};
    case Op::kMul:
      return {L::kBinary, tc::kMul, kAliasSafe};
    case Op::kDiv:
      return {L::kBinary, tc::kDiv, kAliasSafe};
    case Op::kMaximum:
      return {L::kBinary, tc::kMaximum, kAliasSafe};
    case Op::kMinimum:
      return {L::kBinary, tc::kMinimum, kAliasSafe};
    case Op::kPow:
      return {L::kBinary, tc::kPow, kAliasSafe};
    case Op::kSum:
      return {L::kReduce, tc::kSum, kStaged};
    case Op::kMean:
      return {L::kReduce, tc::kMean, kStaged};
    case Op::kMax:
      return {L::kReduce, tc::kMax, kStaged};
    case Op::kMin:
      return {L::kReduce, tc::kMin, kStaged};
    case Op::kArgmax:
      return {L::kArgmax, 0, kStaged};
    case Op::kSoftmax:
      return {L::kSoftmax, 0, kAliasSafe};
    case Op::kLogSoftmax:
      return {L::kSoftmax, 1, kAliasSafe};
    case Op::kLayerNorm:
      return {L::kNorm, 0, kStaged};
    case Op::kRmsNorm:
      return {L::kNorm, 1, kStaged};
    case Op::kTranspose:
      return {L::kPermute, 0, kStaged};
    case Op::kMatmul:
      return {L::kMatmul, 0, kStaged};
    case Op::kUser:  // element-wise ones may alias: AliasSafe looks at the program
      return {L::kUser, 0, kStaged};
  }
  return {};  // not an Op
}

bool CudaImplements(Op op) { return CudaImplOf(op).launcher != CudaLauncher::kNone; }

std::string EntryPointOf(CudaLauncher launcher, DType dtype) {
  switch (launcher) {
    case CudaLauncher::kNone:
    case CudaLauncher::kCopy:
    case CudaLauncher::kUser:
      return "";
    case CudaLauncher::kFill:
      return "tessera_fill";
    case CudaLauncher::kCast:
      return "tessera_cast";
    case CudaLauncher::kUnary:
    case CudaLauncher::kMatmul:
      return "tessera_unary_" + Suffix(dtype);
    case CudaLauncher::kBinary:
      return "tessera_binary_" + Suffix(dtype);
    case CudaLauncher::kReduce:
      return "tessera_reduce_" + Suffix(dtype);
    case CudaLauncher::kArgmax:
      return "tessera_argmax_" + Suffix(dtype);
    case CudaLauncher::kSoftmax:
      return "tessera_softmax_" + Suffix(dtype);
    case CudaLauncher::kNorm:
      return "tessera_norm_" + Suffix(dtype);
    case CudaLauncher::kPermute:
      return absl::StrCat("tessera_permute_", kernels::DTypeSize(dtype));
  }
  return "";
}

int MaxThreadsPerBlock(CudaLauncher launcher) {
  switch (launcher) {
    case CudaLauncher::kNone:
    case CudaLauncher::kCopy:
      return 0;
    case CudaLauncher::kFill:
    case CudaLauncher::kCast:
    case CudaLauncher::kUnary:
    case CudaLauncher::kBinary:
    case CudaLauncher::kPermute:
    case CudaLauncher::kMatmul:  // its kernel: the empty product's scale
      return kElementwiseBlock;
    case CudaLauncher::kReduce:
    case CudaLauncher::kArgmax:
    case CudaLauncher::kSoftmax:
    case CudaLauncher::kNorm:
      return kMaxRowBlock;
    case CudaLauncher::kUser:  // kernels/expr/cuda_codegen.h: kCudaUserMaxReduceBlock
      return 1024;
  }
  return 0;
}

const std::vector<std::string>& FatbinEntryPoints() {
  static const std::vector<std::string>* names = [] {
    auto* list = new std::vector<std::string>{"tessera_cast", "tessera_fill", "tessera_test_fault"};
    for (const char* size : {"1", "2", "4", "8"}) {
      list->push_back(absl::StrCat("tessera_permute_", size));
    }
    for (const char* s : {"f32", "f16", "bf16", "f64", "i32", "i64", "u8"}) {
      if (std::string(s) != "u8") list->push_back(absl::StrCat("tessera_unary_", s));
      list->push_back(absl::StrCat("tessera_binary_", s));
      list->push_back(absl::StrCat("tessera_reduce_", s));
      list->push_back(absl::StrCat("tessera_argmax_", s));
    }
    for (const char* s : {"f32", "f16", "bf16", "f64"}) {
      list->push_back(absl::StrCat("tessera_softmax_", s));
      list->push_back(absl::StrCat("tessera_norm_", s));
    }
    return list;
  }();
  return *names;
}

}  // namespace tessera::cuda
