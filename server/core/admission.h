#ifndef TESSERA_SERVER_CORE_ADMISSION_H_
#define TESSERA_SERVER_CORE_ADMISSION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "server/backend/backend.h"
#include "server/core/tenant_directory.h"

namespace tessera {

/// A device with what is already placed on it.
struct DeviceLoad {
  DeviceInfo device;
  uint64_t reserved_bytes = 0;
  uint32_t contexts = 0;
  /// The compute shares (compute_share_percent) of the tenants on it, summed.
  uint32_t share_percent = 0;
};

/// capacity × overcommit, rounded down, saturating at UINT64_MAX.
uint64_t ReservableBytes(uint64_t capacity_bytes, double overcommit);

/// Chooses the device for a new tenant reserving `request_bytes`: `requested_device` when
/// given, otherwise the device with the most unreserved memory that still has a free
/// context slot. Pure arithmetic, no side effects.
///
/// INVALID_ARGUMENT when `requested_device` is out of range; RESOURCE_EXHAUSTED (with the
/// numbers) when the memory reservation or the device's context limit would be exceeded.
absl::StatusOr<int> ChooseDevice(const std::vector<DeviceLoad>& devices, double overcommit,
                                 uint64_t request_bytes, std::optional<int> requested_device);

/// How a fleet picks a new tenant's home among the nodes it fits (--fleet_placement).
enum class Placement {
  /// The node whose device has the most free memory: tenants spread over the fleet.
  kSpread,
  /// The node whose device has the least free memory that still fits: nodes fill one by
  /// one, leaving others whole for large tenants.
  kPack,
};

/// The node (an index into `nodes`) a new tenant reserving `memory_bytes` with a compute
/// share of `share_percent` goes to: among the nodes not draining, a device whose free memory
/// fits the reservation and whose MPS client limit (if any) has room, chosen by `placement`;
/// ties go to the first by name. Devices whose tenants' shares leave room for this one (sum
/// at most 100 %) come first; a device only memory fits is chosen when no other is (shares
/// are limits on each client, not reservations, so they may add up past 100 %). nullopt
/// when no node has a device that fits. Pure arithmetic.
std::optional<size_t> ChooseNode(const std::vector<FleetNode>& nodes, uint64_t memory_bytes,
                                 uint32_t share_percent, Placement placement);

/// "8.00 GiB (8589934592 bytes)".
std::string FormatBytes(uint64_t bytes);

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_ADMISSION_H_
