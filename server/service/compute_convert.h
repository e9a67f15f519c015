#ifndef TESSERA_SERVER_SERVICE_COMPUTE_CONVERT_H_
#define TESSERA_SERVER_SERVICE_COMPUTE_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"

#include "kernels/expr/ast.h"
#include "kernels/expr/user_kernel.h"
#include "kernels/registry.h"
#include "server/core/tenant_runtime.h"
#include "tessera/v1/compute.pb.h"

namespace tessera {

// Wire types of tessera.v1.Compute to and from the core's. Errors are INVALID_ARGUMENT
// naming the field (prefixed with `field`) and the limit. Everything the wire can say that no
// lookup should be left to judge (lengths, counts, references, durations) is checked here.

/// Largest CreateTensorRequest.data, bytes (docs/api.md); larger tensors go through
/// WriteTensor. The C++ client refuses the same size locally.
inline constexpr size_t kMaxCreateTensorDataBytes = size_t{16} << 20;
/// Longest tensor handle, job id or kernel name a request may carry (a ListTensors page token:
/// twice this); real ones are far shorter, so a longer one is malformed rather than unknown.
inline constexpr size_t kMaxReferenceBytes = 256;
/// Attributes of one launch: entries, name bytes, string bytes, list values. Every catalog
/// attribute and tenant-defined parameter fits well inside them.
inline constexpr size_t kMaxAttrs = 64;
inline constexpr size_t kMaxAttrNameBytes = 64;
inline constexpr size_t kMaxAttrStringBytes = 256;
inline constexpr size_t kMaxAttrListValues = 64;
/// google.protobuf.Duration's own range: 10,000 years.
inline constexpr int64_t kMaxDurationSeconds = 315'576'000'000;

/// Most inputs and outputs any kernel has (the catalog's and tenant-defined ones): a launch
/// that lists more is INVALID_ARGUMENT before any handle is looked up.
size_t MaxKernelInputs();
size_t MaxKernelOutputs();

/// INVALID_ARGUMENT naming `field` when `value` (a tensor handle, job id or kernel name:
/// `what`) is empty or longer than kMaxReferenceBytes. Anything else is for the lookup to
/// answer (NOT_FOUND).
absl::Status CheckReference(absl::string_view value, absl::string_view field,
                            absl::string_view what);
/// A non-negative, valid google.protobuf.Duration (seconds 0..kMaxDurationSeconds, nanos
/// 0..999999999); INVALID_ARGUMENT naming `field`.
absl::StatusOr<absl::Duration> DurationFromProto(const google::protobuf::Duration& duration,
                                                 absl::string_view field);

absl::StatusOr<kernels::DType> DTypeFromProto(int value, absl::string_view field);
absl::StatusOr<kernels::TensorMeta> MetaFromProto(const v1::TensorSpec& spec,
                                                  absl::string_view field);
/// `field` names the map ("attrs", "steps[2].attrs").
absl::StatusOr<kernels::Attrs> AttrsFromProto(
    const google::protobuf::Map<std::string, v1::AttrValue>& attrs, absl::string_view field);
absl::StatusOr<std::vector<OutputSpec>> OutputsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Output>& outputs, absl::string_view field);

void TensorInfoToProto(const TensorInfo& info, v1::TensorInfo* proto);
void JobToProto(const JobInfo& job, v1::Job* proto);
void UsageToProto(const UsageInfo& usage, v1::Usage* proto);
void RegionToProto(const RegionInfo& region, v1::Region* proto);
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

/// One launch: a Launch request (`handles`; `field` empty) or step `index` of a Submit
/// (`operands`; `field` "steps[i]"). Checks what only the wire can get wrong (lengths, counts,
/// references to earlier steps) so that nothing is left to a lookup or a narrowing cast; the
/// core checks the rest against the kernel and the tenant's tensors.
absl::StatusOr<LaunchSpec> StepFromProto(
    const std::string& kernel, const google::protobuf::RepeatedPtrField<v1::Operand>* operands,
    const google::protobuf::RepeatedPtrField<std::string>* handles,
    const google::protobuf::RepeatedPtrField<v1::Output>& outputs,
    const google::protobuf::Map<std::string, v1::AttrValue>& attrs, absl::string_view field,
    int index);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_COMPUTE_CONVERT_H_
