#ifndef TESSERA_SERVER_COMMON_TELEMETRY_H_
#define TESSERA_SERVER_COMMON_TELEMETRY_H_

// What the core reports to the metrics layer without depending on it: finished jobs and
// refusals. The server installs one Sink (server/service/metrics.h); without one, reports
// are dropped. Reporting never blocks on the sink's own locks for long and never fails.
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tessera::telemetry {

/// A job that left the system: ran to an end, or was dropped while queued.
struct JobSample {
  absl::string_view tenant;
  /// The kernel of a one-step job, "program" for several steps.
  absl::string_view kernel;
  /// "succeeded", "failed" or "cancelled".
  absl::string_view outcome;
  /// Accepted to released to the device (to the drop for jobs that never ran).
  absl::Duration queue_wait;
  /// Released to finished; zero for jobs that never ran.
  absl::Duration run_time;
  bool ran = false;
};

class Sink {
 public:
  virtual ~Sink() = default;
  virtual void JobFinished(const JobSample& job) = 0;
  /// A request refused for want of a resource (RESOURCE_EXHAUSTED), by reason.
  virtual void Refused(absl::string_view reason) = 0;
};

/// Installs `sink` (null: none). The sink must outlive every report made while installed.
void SetSink(Sink* sink);
void JobFinished(const JobSample& job);

/// Why a RESOURCE_EXHAUSTED status was answered, carried as a status payload from where the
/// refusal is decided to the call layer, which counts it (tessera_admission_refusals_total).
/// Reasons are a fixed vocabulary: device_memory, device_contexts, tenant_memory,
/// queue_depth, kernel_count, requests_in_flight, request_rate, transfer_queue (and "other"
/// for refusals without one).
inline constexpr char kRefusalPayloadUrl[] = "type.tessera.dev/refusal";
/// `status` with its refusal reason attached.
absl::Status WithRefusalReason(absl::Status status, absl::string_view reason);
/// The reason of a refusal ("other" when none was attached); "" for other statuses.
std::string RefusalReason(const absl::Status& status);
/// Counts a refusal (the call layer, once per refused call).
void Refused(absl::string_view reason);

/// The payload key of a refusal's retry hint (the milliseconds after which a retry may
/// succeed, as decimal text); the call layer sends it as `grpc-retry-pushback-ms`.
inline constexpr char kRetryAfterMsPayload[] = "type.tessera.dev/retry-after-ms";
/// `status` with a retry hint of `ms` milliseconds attached.
absl::Status WithRetryAfterMs(absl::Status status, int64_t ms);
/// The milliseconds a refusal asks the client to wait, or -1 when it carries none.
int64_t RetryAfterMs(const absl::Status& status);

}  // namespace tessera::telemetry

#endif  // TESSERA_SERVER_COMMON_TELEMETRY_H_
