#ifndef TESSERA_SERVER_SERVICE_COMPUTE_CONVERT_H_
#define TESSERA_SERVER_SERVICE_COMPUTE_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"

#include "kernels/expr/ast.h"
#include "kernels/expr/user_kernel.h"
#include "kernels/registry.h"
#include "server/core/tenant_runtime.h"
#include "tessera/v1/compute.pb.h"

namespace tessera {

// Wire types of tessera.v1.Compute to and from the core's. Errors are INVALID_ARGUMENT
// naming the field (prefixed with `field`).

absl::StatusOr<kernels::DType> DTypeFromProto(int value, absl::string_view field);
absl::StatusOr<kernels::TensorMeta> MetaFromProto(const v1::TensorSpec& spec,
                                                  absl::string_view field);
absl::StatusOr<kernels::Attrs> AttrsFromProto(
    const google::protobuf::Map<std::string, v1::AttrValue>& attrs);
absl::StatusOr<std::vector<OutputSpec>> OutputsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Output>& outputs, absl::string_view field);

void TensorInfoToProto(const TensorInfo& info, v1::TensorInfo* proto);
void JobToProto(const JobInfo& job, v1::Job* proto);
void UsageToProto(const UsageInfo& usage, v1::Usage* proto);
/// The whole catalog, built once.
const v1::ListKernelsResponse& KernelCatalogProto();
/// A tenant-defined kernel as ListKernels shows it.
void UserKernelToProto(const kernels::expr::UserKernel& kernel, v1::KernelInfo* info);

/// Largest DefineKernelRequest.source.
inline constexpr size_t kMaxKernelSourceBytes = 32 * 1024;
/// The definition in a DefineKernel request (source text or structured); INVALID_ARGUMENT
/// naming the field. The definition itself is checked by kernels::expr::Compile.
absl::StatusOr<kernels::expr::Definition> DefinitionFromProto(
    const v1::DefineKernelRequest& request);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_COMPUTE_CONVERT_H_
