#include "server/service/call.h"

#include <cstdint>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

#include "server/common/logging.h"
#include "server/common/telemetry.h"
#include "server/service/access_log.h"
#include "server/service/auth.h"

namespace tessera {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxStatusMessageBytes) {
    message.resize(kMaxStatusMessageBytes - 3);
    message += "...";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(message));
}

CallLog::CallLog(grpc::CallbackServerContext* context, absl::string_view rpc)
    : context_(context), rpc_(rpc), record_(FindCallRecord(context)) {
  request_id_ =
      record_ != nullptr ? record_->request_id : RequestIdFrom(context->client_metadata());
  context->AddInitialMetadata("x-request-id", request_id_);
}

void CallLog::set_tenant(std::string tenant) {
  if (record_ != nullptr) record_->set_tenant(tenant);
  tenant_ = std::move(tenant);
}

grpc::Status CallLog::Finish(const absl::Status& status) const {
  if (auto home = HomeOf(status); home.has_value()) {
    context_->AddTrailingMetadata("tessera-home-address", home->first);
    if (!home->second.empty()) context_->AddTrailingMetadata("tessera-home-node", home->second);
  }
  if (std::string reason = telemetry::RefusalReason(status); !reason.empty()) {
    telemetry::Refused(reason);
    // Hints come only with refusals. gRPC's name for one: gRPC's own retry policy honours
    // it, and every client can read it.
    if (const int64_t ms = telemetry::RetryAfterMs(status); ms >= 0) {
      context_->AddTrailingMetadata("grpc-retry-pushback-ms", absl::StrCat(ms));
    }
  }
  return ToGrpcStatus(status);
}

void CallLog::Info(absl::string_view what) const {
  spdlog::info("rpc={} tenant={} request_id={}: {}", rpc_, tenant_.empty() ? "-" : tenant_,
               request_id_, what);
}

absl::StatusOr<size_t> PageLimit(int32_t page_size) {
  constexpr int32_t kDefault = 100;
  constexpr int32_t kMax = 1000;
  if (page_size < 0 || page_size > kMax) {
    return absl::InvalidArgumentError(absl::StrCat("page_size is ", page_size, "; the range is 0..",
                                                   kMax, " (0 means ", kDefault, ")"));
  }
  return static_cast<size_t>(page_size == 0 ? kDefault : page_size);
}

std::string EncodePageToken(absl::string_view kind, absl::string_view last_key) {
  return absl::WebSafeBase64Escape(absl::StrCat(kind, "-after:", last_key));
}

absl::StatusOr<std::string> DecodePageToken(absl::string_view kind, absl::string_view token,
                                            absl::string_view rpc) {
  std::string decoded;
  std::string prefix = absl::StrCat(kind, "-after:");
  if (!absl::WebSafeBase64Unescape(token, &decoded) || !absl::StartsWith(decoded, prefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token is not one this API issued; pass next_page_token from a ", rpc, " reply"));
  }
  return decoded.substr(prefix.size());
}

absl::Status CallStillWanted(grpc::CallbackServerContext* context) {
  if (!context->IsCancelled()) return absl::OkStatus();
  if (context->deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("the call's deadline passed before it could run");
  }
  return absl::CancelledError("the client cancelled the call");
}

}  // namespace tessera
