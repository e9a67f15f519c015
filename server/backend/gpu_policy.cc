#include "server/backend/gpu_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "server/backend/sm_share.h"

namespace tessera {
namespace {

// CUresult values (cuda.h); the CUDA module static_asserts that they match.
enum : int {
  kOutOfMemory = 2,
  kNotInitialized = 3,
  kDeinitialized = 4,
  kDeviceUnavailable = 46,
  kNoDevice = 100,
  kEccUncorrectable = 214,
  kNvlinkUncorrectable = 220,
  kUnsupportedExecAffinity = 224,
  kContained = 226,
  kIllegalAddress = 700,
  kLaunchOutOfResources = 701,
  kLaunchTimeout = 702,
  kContextIsDestroyed = 709,
  kAssert = 710,
  kHardwareStackError = 714,
  kIllegalInstruction = 715,
  kMisalignedAddress = 716,
  kInvalidAddressSpace = 717,
  kInvalidPc = 718,
  kLaunchFailed = 719,
  kNotSupported = 801,
  kSystemNotReady = 802,
  kMpsConnectionFailed = 805,
  kMpsRpcFailure = 806,
  kMpsServerNotReady = 807,
  kMpsMaxClientsReached = 808,
  kMpsMaxConnectionsReached = 809,
  kMpsClientTerminated = 810,
  kExternalDevice = 911,
};

}  // namespace

uint32_t MpsClientContextLimit(int compute_capability_major) {
  return compute_capability_major >= 7 ? 48 : 16;
}

int GreenSmCount(uint32_t share_percent, int device_sms, int min_partition, int alignment) {
  int count = AffinitySmCount(share_percent, device_sms);
  if (count == 0) return 0;
  count = std::max(count, min_partition);
  if (alignment > 1) count = (count + alignment - 1) / alignment * alignment;
  return std::min(count, device_sms);
}

std::vector<int> PickSmGroups(const std::vector<int>& users, int group_sms, int sm_count) {
  if (users.empty() || group_sms <= 0) return {};
  const size_t wanted = std::clamp<size_t>(
      static_cast<size_t>((std::max(sm_count, 1) + group_sms - 1) / group_sms), 1, users.size());
  std::vector<int> order(users.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return users[a] < users[b]; });
  order.resize(wanted);
  std::sort(order.begin(), order.end());
  return order;
}

ContextPlan PlanContext(MpsDecision mps, absl::string_view mps_reason, const GreenSupport& green,
                        uint32_t share_percent, int device_sms) {
  ContextPlan plan;
  if (mps == MpsDecision::kMps) {
    plan.kind = ContextKind::kMps;
    plan.sm_count = AffinitySmCount(share_percent, device_sms);
    plan.compute_share_enforced = true;
    plan.reason = absl::StrCat("MPS client context limited to ", plan.sm_count, " of ", device_sms,
                               " SMs by execution affinity (compute share ", share_percent,
                               "%; the driver may round up); ", mps_reason);
    return plan;
  }
  if (share_percent >= 100) {
    plan.kind = ContextKind::kFallback;
    plan.compute_share_enforced = true;
    plan.reason = absl::StrCat(
        "plain per-tenant context; a 100% compute share needs no SM "
        "partition; ",
        mps_reason);
    return plan;
  }
  if (green.available) {
    plan.kind = ContextKind::kGreen;
    plan.sm_count = GreenSmCount(share_percent, device_sms, green.min_partition, green.alignment);
    plan.compute_share_enforced = true;
    plan.reason = absl::StrCat(
        "green context with ", plan.sm_count, " of ", device_sms, " SMs (compute share ",
        share_percent, "%, rounded up to the device's minimum partition of ", green.min_partition,
        " and alignment of ", green.alignment, " SMs); ", mps_reason);
    return plan;
  }
  plan.kind = ContextKind::kFallback;
  plan.compute_share_enforced = false;
  plan.reason = absl::StrCat("plain per-tenant context; compute share ", share_percent,
                             "% is advisory: green contexts are unavailable (", green.why_not,
                             "); ", mps_reason);
  return plan;
}

CudaErrorClass ClassifyCudaError(int code) {
  CudaErrorClass c;
  switch (code) {
    case kOutOfMemory:
    case kMpsMaxClientsReached:
    case kMpsMaxConnectionsReached:
      c.code = absl::StatusCode::kResourceExhausted;
      return c;
    case kMpsServerNotReady:
      c.code = absl::StatusCode::kUnavailable;
      c.mps_server = true;
      c.retry = true;
      return c;
    case kMpsConnectionFailed:
    case kMpsRpcFailure:
      c.code = absl::StatusCode::kUnavailable;
      c.sticky = true;
      c.mps_server = true;
      c.retry = true;
      return c;
    case kMpsClientTerminated:
      c.code = absl::StatusCode::kUnavailable;
      c.sticky = true;
      return c;
    case kIllegalAddress:
    case kLaunchTimeout:
    case kAssert:
    case kHardwareStackError:
    case kIllegalInstruction:
    case kMisalignedAddress:
    case kInvalidAddressSpace:
    case kInvalidPc:
    case kLaunchFailed:
      c.code = absl::StatusCode::kUnavailable;
      c.sticky = true;
      c.process_fatal = true;
      return c;
    case kEccUncorrectable:
    case kNvlinkUncorrectable:
    case kContained:
    case kExternalDevice:
    case kContextIsDestroyed:
      c.code = absl::StatusCode::kUnavailable;
      c.sticky = true;
      return c;
    case kNotInitialized:
    case kDeinitialized:
    case kDeviceUnavailable:
    case kNoDevice:
    case kSystemNotReady:
      c.code = absl::StatusCode::kUnavailable;
      c.retry = true;
      return c;
    case kLaunchOutOfResources:
    case kUnsupportedExecAffinity:
    case kNotSupported:
      c.code = absl::StatusCode::kFailedPrecondition;
      return c;
    default:
      c.code = absl::StatusCode::kInternal;
      return c;
  }
}

absl::Status CudaErrorStatus(int code, absl::string_view name, absl::string_view description,
                             absl::string_view what) {
  CudaErrorClass c = ClassifyCudaError(code);
  std::string message = absl::StrCat(what, ": ", name, " (", description, ")");
  if (c.process_fatal) {
    absl::StrAppend(&message,
                    "; a fatal GPU fault: CUDA cannot continue in this server process (the "
                    "driver requires it to be relaunched), so every tenant's GPU work failed, "
                    "their tensors are lost, and the server restarts; retry once it is back");
  } else if (c.sticky) {
    absl::StrAppend(&message,
                    "; the tenant's GPU context faulted: its queued work failed, its tensors "
                    "are lost, and the context is being rebuilt");
  }
  if (c.retry) absl::StrAppend(&message, "; retry in a few seconds");
  return absl::Status(c.code, message);
}

}  // namespace tessera
