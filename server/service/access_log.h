#ifndef TESSERA_SERVER_SERVICE_ACCESS_LOG_H_
#define TESSERA_SERVER_SERVICE_ACCESS_LOG_H_

// One place every RPC passes: a gRPC server interceptor that writes one access log line per
// call (request_id, tenant, method, code, duration_ms, peer, bytes_in, bytes_out, and the
// status message of a failure) and counts grpc_server_handled_total and
// grpc_server_handling_seconds (and transfer bytes and time) in Metrics.
//
// The handler learns the call's request id, and tells the line its tenant, through the
// CallRecord that the interceptor registers for the call's context (CallLog in call.h).
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"

namespace tessera {

class Metrics;

/// Methods whose handlers take grpc::ByteBuffer messages rather than generated ones (raw
/// callback methods, transfer_reactors.h): the interceptor counts their received bytes from
/// the buffers. Every other tessera.v1 method takes protobuf messages; a service that
/// registers another raw method names it here.
inline constexpr absl::string_view kRawMethods[] = {"tessera.v1.Compute/WriteTensor",
                                                    "tessera.v1.Compute/ReadTensor"};

/// What the interceptor and the handler share about one call.
struct CallRecord {
  std::string request_id;
  void set_tenant(std::string id) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    tenant = std::move(id);
  }
  std::string get_tenant() const ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    return tenant;
  }
  /// What the call holds until it ends (its tenant's request ticket, auth.h): released when
  /// the interceptor and every handler copy of the record are gone.
  void set_lease(std::shared_ptr<void> held) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    lease = std::move(held);
  }
  bool has_lease() const ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    return lease != nullptr;
  }

  mutable absl::Mutex mu;
  std::string tenant ABSL_GUARDED_BY(mu);
  std::shared_ptr<void> lease ABSL_GUARDED_BY(mu);
};

/// The record the interceptor registered for `context`; null when none (no interceptor).
std::shared_ptr<CallRecord> FindCallRecord(const grpc::ServerContextBase* context);

/// The client's `x-request-id` when well-formed (1..64 of [A-Za-z0-9._-]), else a fresh one.
std::string RequestIdFrom(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata);

struct AccessLogOptions {
  /// "all" (every call, at info), "errors" (calls that did not end OK) or "off".
  std::string mode = "all";
  /// Logs one in `sample` successful calls of each method (failures always); 1: every one.
  uint32_t sample = 1;
  /// --unix_socket: a call over it has an unnamed peer ("unix:"), logged as "unix:PATH".
  std::string unix_socket;
};

/// Validates --access_log / --access_log_sample.
absl::Status CheckAccessLogOptions(const AccessLogOptions& options);

/// The interceptor factory for ServerBuilder::experimental().SetInterceptorCreators.
/// `metrics` may be null (no metrics); it must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewAccessLogFactory(
    AccessLogOptions options, Metrics* metrics);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_ACCESS_LOG_H_
