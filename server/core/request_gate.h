#ifndef TESSERA_SERVER_CORE_REQUEST_GATE_H_
#define TESSERA_SERVER_CORE_REQUEST_GATE_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

/// Bounds the server-side work one tenant can have at once: at most `max_in_flight` requests
/// being handled (each held from authentication until its call ends, streams included) and a
/// token bucket of `rate` requests per second with `burst` tokens. Refusals are
/// RESOURCE_EXHAUSTED naming the quota field and its value, with a retry hint
/// (telemetry::RetryAfterMs; the call layer sends it as `grpc-retry-pushback-ms`) and a
/// refusal reason ("requests_in_flight" or "request_rate").
///
/// Thread-safe; never blocks beyond its own short lock.
class RequestGate {
 public:
  /// Ends one request when destroyed (RAII): hold it for the whole call.
  class Ticket {
   public:
    explicit Ticket(RequestGate* gate) : gate_(gate) {}
    ~Ticket() { gate_->End(); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    RequestGate* const gate_;
  };

  /// `rate` and `burst` > 0. The gate must outlive its tickets (TenantRuntime owns it, and a
  /// ticket holds the runtime).
  RequestGate(uint32_t max_in_flight, double rate, double burst);

  /// Starts a request at `now` (a monotonic clock reading), or refuses it.
  absl::StatusOr<std::unique_ptr<Ticket>> Begin(absl::Duration now) ABSL_LOCKS_EXCLUDED(mu_);
  /// Begin at the process's monotonic clock.
  absl::StatusOr<std::unique_ptr<Ticket>> Begin() ABSL_LOCKS_EXCLUDED(mu_);

  uint32_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

  /// What the gate has done since it was built (registration or server start).
  struct Counts {
    uint32_t in_flight = 0;
    uint64_t refused_in_flight = 0;  // past max_in_flight
    uint64_t refused_rate = 0;       // no token left
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

  /// The bucket's size for a rate: a tenth of a second of requests, at least `max_in_flight`.
  static double BurstFor(uint32_t max_in_flight, double rate);

 private:
  void End() ABSL_LOCKS_EXCLUDED(mu_);

  const uint32_t max_in_flight_;
  const double rate_;
  const double burst_;
  mutable absl::Mutex mu_;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_rate_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Duration refilled_at_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool started_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_REQUEST_GATE_H_
