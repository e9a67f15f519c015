#include "tests/fuzz/fuzz_util.h"

#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shape.h"

namespace tessera::fuzz {

bool SkipKnownFindings() {
  static const bool skip = [] {
    const char* value = std::getenv("TESSERA_FUZZ_SKIP_KNOWN");
    return value != nullptr && *value != '\0' && std::string(value) != "0";
  }();
  return skip;
}

bool ParseMessage(const uint8_t* data, size_t size, google::protobuf::Message* message) {
  static const bool silenced = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)silenced;
  return message->ParseFromArray(data, static_cast<int>(size));
}

void RunPlanOnCpu(const kernels::Plan& plan, uint64_t seed, int64_t max_elements) {
  static const bool initialized = [] {
    kernels::InitCpuKernels();
    return true;
  }();
  (void)initialized;
  // Known finding (docs/fuzzing.md): layer_norm and rms_norm divide by a last dimension of 0.
  if (SkipKnownFindings() &&
      (plan.kernel->op == kernels::Op::kLayerNorm || plan.kernel->op == kernels::Op::kRmsNorm) &&
      !plan.inputs.empty() && !plan.inputs[0].shape.empty() && plan.inputs[0].shape.back() == 0) {
    return;
  }
  int64_t elements = 0;
  for (const auto* metas : {&plan.inputs, &plan.outputs}) {
    for (const kernels::TensorMeta& meta : *metas) {
      elements += kernels::CheckedNumElements(meta.shape);
      if (elements > max_elements) return;
    }
  }
  // Exactly-sized buffers; the inputs get bytes of every value (NaN, infinities, bools
  // that are neither 0 nor 1: a client may upload any bytes).
  auto allocate = [](const kernels::TensorMeta& meta) {
    const size_t bytes = static_cast<size_t>(kernels::CheckedNumElements(meta.shape)) *
                         kernels::DTypeSize(meta.dtype);
    return std::make_pair(std::unique_ptr<uint8_t[]>(new uint8_t[bytes]), bytes);
  };
  uint64_t state = seed | 1;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (const kernels::TensorMeta& meta : plan.inputs) {
    auto [buffer, bytes] = allocate(meta);
    for (size_t i = 0; i < bytes; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      buffer[i] = static_cast<uint8_t>(state >> 24);
    }
    inputs.push_back(buffer.get());
    buffers.push_back(std::move(buffer));
  }
  for (const kernels::TensorMeta& meta : plan.outputs) {
    auto [buffer, bytes] = allocate(meta);
    for (size_t i = 0; i < bytes; ++i) buffer[i] = 0;  // matmul's beta reads the outputs
    outputs.push_back(buffer.get());
    buffers.push_back(std::move(buffer));
  }
  kernels::SerialParallel serial;
  absl::Status status = kernels::RunCpuKernel(plan, inputs, outputs, serial);
  FUZZ_CHECK(status.ok(), "RunCpuKernel(", plan.kernel->name,
             ") failed on a validated plan: ", status.ToString());
}

}  // namespace tessera::fuzz
