#ifndef TESSERA_SERVER_BACKEND_GPU_POLICY_H_
#define TESSERA_SERVER_BACKEND_GPU_POLICY_H_

// The CUDA backend's decisions as plain functions, so they are unit-tested on any host:
// which context kind a tenant gets and with how many SMs, how many MPS clients a device
// admits, and what a CUDA driver error means for the tenant and its context.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "server/backend/backend.h"

namespace tessera {

/// MPS client contexts per device: 48 on Volta (compute capability 7.0) and later, 16 before
/// (NVIDIA's MPS guide, "Client-Server Connection Limits").
uint32_t MpsClientContextLimit(int compute_capability_major);

/// What the driver says about SM-partitioned green contexts on a device.
struct GreenSupport {
  bool available = false;
  /// When unavailable: why (driver too old, API missing, device query failed).
  std::string why_not;
  /// The device's SM resource rules (CUdevSmResource.minSmPartitionSize and
  /// .smCoscheduledAlignment).
  int min_partition = 0;
  int alignment = 0;
};

/// SMs for a green context from a compute share: share% of `device_sms` rounded up, then up
/// to the partition minimum and to a multiple of the alignment, at most `device_sms`.
/// 0 when the device reports no SMs.
int GreenSmCount(uint32_t share_percent, int device_sms, int min_partition, int alignment);

/// Which of a device's equal SM groups (one split of the device) a green context takes to
/// hold `sm_count` SMs: ceil(sm_count / group_sms) groups, the least used first (`users[i]`:
/// live green contexts on group i; ties to the lower index). Tenants whose shares fit on the
/// device so get disjoint SMs, and an overcommitted device is shared evenly; without this
/// every tenant would get the split's first group. Empty when there are no groups.
std::vector<int> PickSmGroups(const std::vector<int>& users, int group_sms, int sm_count);

/// The context a tenant is to get, before the driver is asked.
struct ContextPlan {
  ContextKind kind = ContextKind::kFallback;
  /// SMs to request (MPS execution affinity or green partition); 0 for a plain context.
  int sm_count = 0;
  bool compute_share_enforced = false;
  std::string reason;
};

/// MPS → an MPS client context with an execution-affinity SM count; otherwise a green
/// context where supported; otherwise a plain context whose share is advisory (a 100%
/// share needs no partition and is met by a plain context). `mps_reason` says why MPS is
/// or is not used and is carried into the reason.
ContextPlan PlanContext(MpsDecision mps, absl::string_view mps_reason, const GreenSupport& green,
                        uint32_t share_percent, int device_sms);

/// What a CUresult means here.
struct CudaErrorClass {
  absl::StatusCode code = absl::StatusCode::kInternal;
  /// The context is unusable (a sticky error): fail its work, lose its memory, rebuild it.
  bool sticky = false;
  /// Sticky for the whole process: every context in it reports the error from now on and no
  /// new context can be created, so nothing can be rebuilt in this process. NVIDIA documents
  /// these errors as "the process must be terminated and relaunched" (illegal address,
  /// launch timeout, device assert, hardware stack error, illegal instruction, misaligned
  /// address, invalid address space, invalid PC, launch failed); seen on an H100 (driver
  /// 580): after one context's illegal address, another context's next call and every
  /// cuCtxCreate failed with it, also after the faulting context was destroyed.
  bool process_fatal = false;
  /// The MPS server faulted or is unreachable: re-probe MPS.
  bool mps_server = false;
  /// Worth retrying later (with a hint in the message).
  bool retry = false;
};
CudaErrorClass ClassifyCudaError(int code);

/// A status for a failed driver call: the class's code, `what` failed, the driver's error
/// name and description, and a retry hint where one applies.
absl::Status CudaErrorStatus(int code, absl::string_view name, absl::string_view description,
                             absl::string_view what);

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_GPU_POLICY_H_
