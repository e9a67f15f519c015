#include "server/core/request_gate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "absl/strings/str_format.h"

#include "server/common/telemetry.h"

namespace tessera {
namespace {

absl::Status Refusal(std::string message, const char* reason, int64_t retry_after_ms) {
  return telemetry::WithRetryAfterMs(
      telemetry::WithRefusalReason(absl::ResourceExhaustedError(std::move(message)), reason),
      retry_after_ms);
}

}  // namespace

RequestGate::RequestGate(uint32_t max_in_flight, double rate, double burst)
    : max_in_flight_(std::max<uint32_t>(1, max_in_flight)),
      rate_(rate > 0 ? rate : 1),
      burst_(std::max(1.0, burst)),
      tokens_(burst_) {}

double RequestGate::BurstFor(uint32_t max_in_flight, double rate) {
  return std::max(static_cast<double>(max_in_flight), rate / 10);
}

absl::StatusOr<std::unique_ptr<RequestGate::Ticket>> RequestGate::Begin() {
  const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
  return Begin(absl::FromChrono(std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch)));
}

absl::StatusOr<std::unique_ptr<RequestGate::Ticket>> RequestGate::Begin(absl::Duration now) {
  absl::MutexLock lock(&mu_);
  if (!started_ || now < refilled_at_) {
    started_ = true;
    refilled_at_ = now;
  }
  tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - refilled_at_) * rate_);
  refilled_at_ = now;
  if (in_flight_ >= max_in_flight_) {
    ++refused_in_flight_;
    // A slot frees when one of the tenant's calls ends: no better hint than "soon".
    return Refusal(absl::StrFormat("the tenant has %d requests in flight, its "
                                   "quota.max_requests_in_flight; retry when one has finished",
                                   max_in_flight_),
                   "requests_in_flight", 10);
  }
  if (tokens_ < 1) {
    ++refused_rate_;
    const int64_t wait_ms = static_cast<int64_t>(std::ceil((1 - tokens_) / rate_ * 1000));
    return Refusal(absl::StrFormat("the tenant sent requests faster than its "
                                   "quota.requests_per_second (%g per second, bursts of %g); "
                                   "retry in %d ms",
                                   rate_, burst_, wait_ms),
                   "request_rate", std::max<int64_t>(1, wait_ms));
  }
  tokens_ -= 1;
  ++in_flight_;
  return std::make_unique<Ticket>(this);
}

void RequestGate::End() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

uint32_t RequestGate::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

RequestGate::Counts RequestGate::counts() const {
  absl::MutexLock lock(&mu_);
  return Counts{.in_flight = in_flight_,
                .refused_in_flight = refused_in_flight_,
                .refused_rate = refused_rate_};
}

}  // namespace tessera
