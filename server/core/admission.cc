#include "server/core/admission.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "server/common/telemetry.h"

namespace tessera {
namespace {

uint64_t Unreserved(const DeviceLoad& d, double overcommit) {
  uint64_t reservable = ReservableBytes(d.device.memory_bytes, overcommit);
  return d.reserved_bytes >= reservable ? 0 : reservable - d.reserved_bytes;
}

bool HasContextSlot(const DeviceLoad& d) {
  return d.device.context_limit == 0 || d.contexts < d.device.context_limit;
}

absl::Status CheckFits(const DeviceLoad& d, double overcommit, uint64_t request_bytes) {
  if (!HasContextSlot(d)) {
    return telemetry::WithRefusalReason(
        absl::ResourceExhaustedError(
            absl::StrCat("device ", d.device.index, " (", d.device.name, ") already has ",
                         d.contexts, " tenant contexts; its limit is ", d.device.context_limit)),
        "device_contexts");
  }
  uint64_t free = Unreserved(d, overcommit);
  if (request_bytes > free) {
    return telemetry::WithRefusalReason(
        absl::ResourceExhaustedError(absl::StrFormat(
            "quota.device_memory_bytes %s does not fit on device %d (%s): %s reserved of %s "
            "reservable (capacity %s x memory_overcommit %g); %s unreserved",
            FormatBytes(request_bytes), d.device.index, d.device.name,
            FormatBytes(d.reserved_bytes),
            FormatBytes(ReservableBytes(d.device.memory_bytes, overcommit)),
            FormatBytes(d.device.memory_bytes), overcommit, FormatBytes(free))),
        "device_memory");
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t ReservableBytes(uint64_t capacity_bytes, double overcommit) {
  long double product = static_cast<long double>(capacity_bytes) * overcommit;
  if (!(product > 0)) return 0;
  if (product >= static_cast<long double>(std::numeric_limits<uint64_t>::max())) {
    return std::numeric_limits<uint64_t>::max();
  }
  return static_cast<uint64_t>(std::floor(product));
}

absl::StatusOr<int> ChooseDevice(const std::vector<DeviceLoad>& devices, double overcommit,
                                 uint64_t request_bytes, std::optional<int> requested_device) {
  if (devices.empty()) return absl::UnavailableError("the backend has no devices");
  if (requested_device.has_value()) {
    int index = *requested_device;
    if (index < 0 || static_cast<size_t>(index) >= devices.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_index is ", index, "; the range is 0..", devices.size() - 1));
    }
    absl::Status fits = CheckFits(devices[index], overcommit, request_bytes);
    if (!fits.ok()) return fits;
    return index;
  }
  // Most unreserved memory among devices with a context slot; ties go to the lowest index.
  const DeviceLoad* best = nullptr;
  for (const DeviceLoad& d : devices) {
    if (!HasContextSlot(d)) continue;
    if (best == nullptr || Unreserved(d, overcommit) > Unreserved(*best, overcommit)) best = &d;
  }
  if (best == nullptr) {
    return telemetry::WithRefusalReason(
        absl::ResourceExhaustedError(
            absl::StrCat("no device has a free tenant context slot; e.g. ",
                         CheckFits(devices.front(), overcommit, request_bytes).message())),
        "device_contexts");
  }
  absl::Status fits = CheckFits(*best, overcommit, request_bytes);
  if (!fits.ok()) return fits;
  return best->device.index;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " bytes");
  return absl::StrFormat("%.2f %s (%d bytes)", value, kUnits[unit], bytes);
}

std::optional<size_t> ChooseNode(const std::vector<FleetNode>& nodes, uint64_t memory_bytes,
                                 uint32_t share_percent, Placement placement) {
  for (const bool share_fits : {true, false}) {
    std::optional<size_t> best;
    uint64_t best_free = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].draining) continue;
      for (const FleetDevice& d : nodes[i].devices) {
        if (d.free_memory_bytes < memory_bytes) continue;
        if (d.context_limit != 0 && d.tenants >= d.context_limit) continue;
        if (share_fits && uint64_t{d.share_percent} + share_percent > 100) continue;
        const bool better = !best.has_value() ||
                            (placement == Placement::kSpread ? d.free_memory_bytes > best_free
                                                             : d.free_memory_bytes < best_free);
        if (better) {
          best = i;
          best_free = d.free_memory_bytes;
        }
      }
    }
    if (best.has_value()) return best;
  }
  return std::nullopt;
}

}  // namespace tessera
