#ifndef TESSERA_SERVER_SERVICE_CONVERT_H_
#define TESSERA_SERVER_SERVICE_CONVERT_H_

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

#include "server/backend/backend.h"
#include "server/common/tenant.h"
#include "server/core/tenant_table.h"
#include "tessera/v1/tenant_admin.pb.h"

namespace tessera {

// Conversions between the wire types (tessera.v1) and the core's plain types. Range checks
// are the core's job; these only map representations.

Quota QuotaFromProto(const v1::Quota& proto);
void QuotaToProto(const Quota& quota, v1::Quota* proto);
TenantSpec TenantSpecFromProto(const v1::RegisterTenantRequest& request);
void TenantToProto(const TenantView& view, v1::Tenant* proto);
void TimeToProto(absl::Time time, google::protobuf::Timestamp* proto);
v1::ContextKind ContextKindToProto(ContextKind kind);
v1::MpsDecision MpsDecisionToProto(MpsDecision decision);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_CONVERT_H_
