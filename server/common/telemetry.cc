#include "server/common/telemetry.h"

#include <atomic>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tessera::telemetry {
namespace {

std::atomic<Sink*> g_sink{nullptr};

}  // namespace

void SetSink(Sink* sink) { g_sink.store(sink, std::memory_order_release); }

void JobFinished(const JobSample& job) {
  if (Sink* sink = g_sink.load(std::memory_order_acquire)) sink->JobFinished(job);
}

absl::Status WithRefusalReason(absl::Status status, absl::string_view reason) {
  status.SetPayload(kRefusalPayloadUrl, absl::Cord(reason));
  return status;
}

std::string RefusalReason(const absl::Status& status) {
  if (!absl::IsResourceExhausted(status)) return "";
  auto reason = status.GetPayload(kRefusalPayloadUrl);
  return reason.has_value() ? std::string(*reason) : "other";
}

absl::Status WithRetryAfterMs(absl::Status status, int64_t ms) {
  status.SetPayload(kRetryAfterMsPayload, absl::Cord(absl::StrCat(ms)));
  return status;
}

int64_t RetryAfterMs(const absl::Status& status) {
  const auto payload = status.GetPayload(kRetryAfterMsPayload);
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms)) return -1;
  return ms;
}

void Refused(absl::string_view reason) {
  if (Sink* sink = g_sink.load(std::memory_order_acquire)) sink->Refused(reason);
}

}  // namespace tessera::telemetry
