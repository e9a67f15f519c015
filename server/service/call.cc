#include "server/service/call.h"

#include <cstdint>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
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

absl::Status CallStillWanted(grpc::CallbackServerContext* context) {
  if (!context->IsCancelled()) return absl::OkStatus();
  if (context->deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("the call's deadline passed before it could run");
  }
  return absl::CancelledError("the client cancelled the call");
}

}  // namespace tessera
