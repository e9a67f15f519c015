#include "server/common/telemetry.h"

#include <atomic>

#include "absl/strings/cord.h"

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

void Refused(absl::string_view reason) {
  if (Sink* sink = g_sink.load(std::memory_order_acquire)) sink->Refused(reason);
}

}  // namespace tessera::telemetry
