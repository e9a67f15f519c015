#include "server/service/call.h"

#include <cstdint>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

#include "server/common/logging.h"

namespace tessera {
namespace {

constexpr size_t kMaxRequestIdLength = 64;

bool IsWellFormedRequestId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxRequestIdLength) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxStatusMessageBytes) {
    message.resize(kMaxStatusMessageBytes - 3);
    message += "...";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(message));
}

CallLog::CallLog(grpc::CallbackServerContext* context, absl::string_view rpc) : rpc_(rpc) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("x-request-id");
  if (it != metadata.end() &&
      IsWellFormedRequestId(absl::string_view(it->second.data(), it->second.size()))) {
    request_id_.assign(it->second.data(), it->second.size());
  } else {
    request_id_ = NewRequestId();
  }
  context->AddInitialMetadata("x-request-id", request_id_);
}

grpc::Status CallLog::Finish(const absl::Status& status) const {
  if (!status.ok()) {
    spdlog::warn("rpc={} code={} tenant={} request_id={}: {}", rpc_,
                 absl::StatusCodeToString(status.code()), tenant_.empty() ? "-" : tenant_,
                 request_id_, status.message());
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
