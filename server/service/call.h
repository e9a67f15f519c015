#ifndef TESSERA_SERVER_SERVICE_CALL_H_
#define TESSERA_SERVER_SERVICE_CALL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace tessera {

/// Longest status message sent to a client; longer ones are cut with an ellipsis.
inline constexpr size_t kMaxStatusMessageBytes = 1024;

/// The one conversion from absl::Status to grpc::Status (codes are numerically identical).
grpc::Status ToGrpcStatus(const absl::Status& status);

struct CallRecord;

/// Per-call bookkeeping at the adapter edge: the request id (the client's `x-request-id` when
/// well-formed, else a fresh one; echoed in initial metadata) and the caller's tenant once
/// known, shared with the access log interceptor (access_log.h), which writes the call's one
/// access line; refusals (RESOURCE_EXHAUSTED) are counted by reason.
class CallLog {
 public:
  CallLog(grpc::CallbackServerContext* context, absl::string_view rpc);

  const std::string& request_id() const { return request_id_; }
  void set_tenant(std::string tenant);

  /// Counts a refusal by its reason, adds its retry hint (telemetry::RetryAfterMs) as the
  /// `grpc-retry-pushback-ms` trailer, and returns the grpc status. Call it once, right
  /// before the reactor's Finish.
  grpc::Status Finish(const absl::Status& status) const;
  /// Logs an informational line tagged with the call (for mutations).
  void Info(absl::string_view what) const;

 private:
  grpc::CallbackServerContext* const context_;
  std::string rpc_;
  std::string request_id_;
  std::string tenant_;
  std::shared_ptr<CallRecord> record_;  // null without the interceptor
};

/// The page size of a List call: `page_size` 0..1000, 0 meaning 100; INVALID_ARGUMENT otherwise.
absl::StatusOr<size_t> PageLimit(int32_t page_size);
/// Opaque page tokens: base64url of "<kind>-after:<last key>".
std::string EncodePageToken(absl::string_view kind, absl::string_view last_key);
/// The last key of a token EncodePageToken(kind, …) made; INVALID_ARGUMENT naming `rpc`
/// (whose reply carries next_page_token) for anything else.
absl::StatusOr<std::string> DecodePageToken(absl::string_view kind, absl::string_view token,
                                            absl::string_view rpc);

/// CANCELLED or DEADLINE_EXCEEDED when the client has gone; OK otherwise.
absl::Status CallStillWanted(grpc::CallbackServerContext* context);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_CALL_H_
