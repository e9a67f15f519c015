// DefineKernel as the Compute service receives it (tessera.v1.DefineKernelRequest, source text
// or the structured definition): the request converter (server/service/compute_convert.cc,
// DefinitionFromProto), then the kernel compiler and a launch of the kernel, as
// kernel_checks.h describes; and the ListKernels view of the kernel (UserKernelToProto).
// Input: a serialized tessera.fuzz.DefineKernelCase (tests/fuzz/fuzz_inputs.proto).
#include <cstdint>

#include "kernels/expr/compile.h"
#include "kernels/expr/user_kernel.h"
#include "server/service/compute_convert.h"
#include "tests/fuzz/fuzz_inputs.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/kernel_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::fuzz::DefineKernelCase input;
  if (!tessera::fuzz::ParseMessage(data, size, &input)) return 0;

  absl::StatusOr<tessera::kernels::expr::Definition> definition =
      tessera::DefinitionFromProto(input.request());
  if (!definition.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(definition.status()), definition.status().ToString());
    FUZZ_CHECK(definition.status().message().size() <= 2048, "an error message of ",
               definition.status().message().size(), " bytes");
    return 0;
  }
  std::vector<tessera::kernels::Shape> shapes;
  for (const tessera::fuzz::ShapeDims& s : input.input_shapes()) {
    shapes.emplace_back(s.dims().begin(), s.dims().end());
  }
  absl::StatusOr<tessera::kernels::Attrs> attrs = tessera::AttrsFromProto(input.attrs(), "attrs");
  if (!attrs.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(attrs.status()), attrs.status().ToString());
    attrs = tessera::kernels::Attrs();
  }
  tessera::kernels::expr::Definition copy = *definition;
  if (!tessera::fuzz::CheckDefinition(*std::move(definition), shapes, *std::move(attrs),
                                      static_cast<uint64_t>(size))) {
    return 0;
  }
  // What ListKernels shows of it.
  absl::StatusOr<std::shared_ptr<const tessera::kernels::expr::UserKernel>> kernel =
      tessera::kernels::expr::MakeUserKernel(std::move(copy));
  FUZZ_CHECK(kernel.ok(), "a definition compiled once and not twice");
  tessera::v1::KernelInfo info;
  tessera::UserKernelToProto(**kernel, &info);
  FUZZ_CHECK(info.tenant_defined() && info.name() == (*kernel)->program.definition.name,
             "UserKernelToProto lost the name");
  return 0;
}
