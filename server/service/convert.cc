#include "server/service/convert.h"

namespace tessera {

Quota QuotaFromProto(const v1::Quota& proto) {
  Quota quota;
  quota.device_memory_bytes = proto.device_memory_bytes();
  quota.compute_share_percent = proto.compute_share_percent();
  quota.max_streams = proto.max_streams();
  quota.max_queued_jobs = proto.max_queued_jobs();
  quota.max_requests_in_flight = proto.max_requests_in_flight();
  quota.requests_per_second = proto.requests_per_second();
  quota.max_region_bytes = proto.max_region_bytes();
  // UNSPECIFIED means the default; other values pass through for validation to judge.
  quota.priority = proto.priority() == v1::PRIORITY_UNSPECIFIED
                       ? Priority::kNormal
                       : static_cast<Priority>(proto.priority());
  return quota;
}

void QuotaToProto(const Quota& quota, v1::Quota* proto) {
  proto->set_device_memory_bytes(quota.device_memory_bytes);
  proto->set_compute_share_percent(quota.compute_share_percent);
  proto->set_max_streams(quota.max_streams);
  proto->set_max_queued_jobs(quota.max_queued_jobs);
  proto->set_max_requests_in_flight(quota.max_requests_in_flight);
  proto->set_requests_per_second(quota.requests_per_second);
  proto->set_max_region_bytes(quota.max_region_bytes);
  proto->set_priority(static_cast<v1::Priority>(quota.priority));
}

TenantSpec TenantSpecFromProto(const v1::RegisterTenantRequest& request) {
  TenantSpec spec;
  spec.id = request.tenant_id();
  spec.display_name = request.display_name();
  spec.labels = Labels(request.labels().begin(), request.labels().end());
  spec.quota = QuotaFromProto(request.quota());
  if (request.has_device_index()) spec.device_index = request.device_index();
  return spec;
}

void TimeToProto(absl::Time time, google::protobuf::Timestamp* proto) {
  int64_t micros = absl::ToUnixMicros(time);
  int64_t seconds = micros / 1000000;
  int64_t rem = micros % 1000000;
  if (rem < 0) {
    rem += 1000000;
    --seconds;
  }
  proto->set_seconds(seconds);
  proto->set_nanos(static_cast<int32_t>(rem * 1000));
}

v1::ContextKind ContextKindToProto(ContextKind kind) {
  switch (kind) {
    case ContextKind::kCpu:
      return v1::CONTEXT_KIND_CPU;
    case ContextKind::kMps:
      return v1::CONTEXT_KIND_MPS;
    case ContextKind::kFallback:
      return v1::CONTEXT_KIND_FALLBACK;
    case ContextKind::kGreen:
      return v1::CONTEXT_KIND_GREEN;
  }
  return v1::CONTEXT_KIND_UNSPECIFIED;
}

v1::MpsDecision MpsDecisionToProto(MpsDecision decision) {
  switch (decision) {
    case MpsDecision::kMps:
      return v1::MPS_DECISION_MPS;
    case MpsDecision::kFallback:
      return v1::MPS_DECISION_FALLBACK;
    case MpsDecision::kNotApplicable:
      return v1::MPS_DECISION_NOT_APPLICABLE;
  }
  return v1::MPS_DECISION_UNSPECIFIED;
}

void TenantToProto(const TenantView& view, v1::Tenant* proto) {
  const TenantRecord& r = view.record;
  proto->set_tenant_id(r.id);
  proto->set_display_name(r.display_name);
  proto->mutable_labels()->insert(r.labels.begin(), r.labels.end());
  QuotaToProto(r.quota, proto->mutable_quota());
  proto->mutable_context()->set_kind(ContextKindToProto(view.context.kind));
  proto->mutable_context()->set_reason(view.context.reason);
  proto->mutable_context()->set_compute_share_enforced(view.context.compute_share_enforced);
  proto->set_device_index(r.device_index);
  TimeToProto(r.create_time, proto->mutable_create_time());
  TimeToProto(r.update_time, proto->mutable_update_time());
  TimeToProto(r.key_create_time, proto->mutable_key_create_time());
  proto->set_home_node(view.home_node);
}

}  // namespace tessera
