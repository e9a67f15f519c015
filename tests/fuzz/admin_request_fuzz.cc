// The TenantAdmin service's request converters and validators: TenantSpecFromProto and
// QuotaFromProto (server/service/convert.cc), ValidateTenantSpec, ValidateTenantId,
// ValidateDisplayName, ValidateLabels and NormalizeQuota (server/core/validation.cc), and the
// page tokens of ListTenants (server/service/call.cc). UpdateTenant's mask handling
// (UpdateFromRequest) is private to tenant_admin_service.cc; the checks TenantTable::Update
// applies to what it produces are fuzzed instead.
//
// Input: a serialized tessera.fuzz.AdminCase (tests/fuzz/fuzz_inputs.proto).
//
// Properties: refusals are INVALID_ARGUMENT with a bounded message; an accepted registration
// has a DNS-label id, a quota inside the documented ranges that normalizes to itself and
// survives the trip to the wire and back, and converts to a Tenant reply.
#include <cstdint>

#include "server/core/validation.h"
#include "server/service/call.h"
#include "server/service/convert.h"
#include "tests/fuzz/fuzz_inputs.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tessera::Quota;

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(absl::IsInvalidArgument(status), status.ToString());
  FUZZ_CHECK(status.message().size() <= tessera::kMaxStatusMessageBytes, "an error message of ",
             status.message().size(), " bytes");
}

void CheckId(const std::string& id) {
  absl::Status valid = tessera::ValidateTenantId(id);
  if (!valid.ok()) {
    CheckRefusal(valid);
    return;
  }
  FUZZ_CHECK(!id.empty() && id.size() <= tessera::kMaxTenantIdLength, "id of ", id.size());
  for (char c : id) FUZZ_CHECK((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-', id);
  FUZZ_CHECK(id.front() != '-' && id.back() != '-', id);
  // An id is what a ListTenants page token carries.
  absl::StatusOr<std::string> after =
      tessera::DecodePageToken("tenants", tessera::EncodePageToken("tenants", id), "ListTenants");
  FUZZ_CHECK(after.ok() && *after == id, "page token of ", id, " does not round-trip");
}

void Register(const tessera::v1::RegisterTenantRequest& request) {
  tessera::TenantSpec spec = tessera::TenantSpecFromProto(request);
  FUZZ_CHECK(spec.id == request.tenant_id() && spec.labels.size() == request.labels().size(),
             "TenantSpecFromProto lost data");
  absl::StatusOr<tessera::TenantSpec> valid = tessera::ValidateTenantSpec(spec);
  if (!valid.ok()) {
    CheckRefusal(valid.status());
    return;
  }
  CheckId(valid->id);
  const Quota& q = valid->quota;
  FUZZ_CHECK(q.device_memory_bytes >= tessera::kMinDeviceMemoryBytes &&
                 q.device_memory_bytes <= tessera::kMaxDeviceMemoryBytes,
             "memory ", q.device_memory_bytes);
  FUZZ_CHECK(q.compute_share_percent >= 1 && q.compute_share_percent <= 100, "share ",
             q.compute_share_percent);
  FUZZ_CHECK(q.max_streams >= 1 && q.max_streams <= tessera::kMaxStreams, "streams ",
             q.max_streams);
  FUZZ_CHECK(q.max_queued_jobs >= 1 && q.max_queued_jobs <= tessera::kMaxQueuedJobs, "jobs ",
             q.max_queued_jobs);
  FUZZ_CHECK(q.priority == tessera::Priority::kNormal || q.priority == tessera::Priority::kLow,
             "priority ", static_cast<int>(q.priority));
  absl::StatusOr<Quota> again = tessera::NormalizeQuota(q);
  FUZZ_CHECK(again.ok() && *again == q, "NormalizeQuota is not idempotent");
  tessera::v1::Quota wire;
  tessera::QuotaToProto(q, &wire);
  FUZZ_CHECK(tessera::QuotaFromProto(wire) == q, "a quota does not survive the wire");
  FUZZ_CHECK(!valid->device_index.has_value() || *valid->device_index >= 0, "device index");

  // The reply a registration sends.
  tessera::TenantView view;
  view.record.id = valid->id;
  view.record.display_name = valid->display_name;
  view.record.labels = valid->labels;
  view.record.quota = q;
  view.record.device_index = valid->device_index.value_or(0);
  tessera::v1::Tenant tenant;
  tessera::TenantToProto(view, &tenant);
  FUZZ_CHECK(tenant.tenant_id() == valid->id && tenant.labels().size() == valid->labels.size(),
             "TenantToProto lost data");
}

void Update(const tessera::v1::UpdateTenantRequest& request) {
  const tessera::v1::Tenant& tenant = request.tenant();
  absl::Status id = tessera::ValidateTenantId(tenant.tenant_id(), "tenant.tenant_id");
  if (!id.ok()) CheckRefusal(id);
  // What TenantTable::Update checks of the new metadata.
  absl::Status name = tessera::ValidateDisplayName(tenant.display_name());
  if (!name.ok()) CheckRefusal(name);
  tessera::Labels labels(tenant.labels().begin(), tenant.labels().end());
  absl::Status valid = tessera::ValidateLabels(labels);
  if (!valid.ok()) {
    CheckRefusal(valid);
    return;
  }
  FUZZ_CHECK(labels.size() <= tessera::kMaxLabels, labels.size(), " labels");
  for (const auto& [key, value] : labels) {
    FUZZ_CHECK(!key.empty() && key.size() <= tessera::kMaxLabelKeyLength, "label key");
    FUZZ_CHECK(value.size() <= tessera::kMaxLabelValueBytes, "label value");
  }
  if (tenant.has_quota()) (void)tessera::NormalizeQuota(tessera::QuotaFromProto(tenant.quota()));
}

void List(const tessera::v1::ListTenantsRequest& request) {
  absl::StatusOr<size_t> limit = tessera::PageLimit(request.page_size());
  if (limit.ok()) {
    FUZZ_CHECK(*limit >= 1 && *limit <= 1000, "page limit ", *limit);
  } else {
    CheckRefusal(limit.status());
  }
  if (request.page_token().empty()) return;
  absl::StatusOr<std::string> after =
      tessera::DecodePageToken("tenants", request.page_token(), "ListTenants");
  if (!after.ok()) {
    CheckRefusal(after.status());
    return;
  }
  CheckId(*after);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::fuzz::AdminCase input;
  if (!tessera::fuzz::ParseMessage(data, size, &input)) return 0;
  switch (input.request_case()) {
    case tessera::fuzz::AdminCase::kRegisterTenant:
      Register(input.register_tenant());
      break;
    case tessera::fuzz::AdminCase::kUpdateTenant:
      Update(input.update_tenant());
      break;
    case tessera::fuzz::AdminCase::kGetTenant:
      CheckId(input.get_tenant().tenant_id());
      break;
    case tessera::fuzz::AdminCase::kListTenants:
      List(input.list_tenants());
      break;
    case tessera::fuzz::AdminCase::kDeregisterTenant:
      CheckId(input.deregister_tenant().tenant_id());
      break;
    case tessera::fuzz::AdminCase::kRotateTenantKey:
      CheckId(input.rotate_tenant_key().tenant_id());
      break;
    case tessera::fuzz::AdminCase::REQUEST_NOT_SET:
      break;
  }
  return 0;
}
