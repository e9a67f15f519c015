#include "server/backend/sm_share.h"

#include <algorithm>

namespace tessera {

int AffinitySmCount(uint32_t share_percent, int device_sms) {
  if (device_sms <= 0) return 0;
  uint64_t share = std::min<uint64_t>(share_percent, 100);
  uint64_t sms = (share * static_cast<uint64_t>(device_sms) + 99) / 100;  // rounded up
  return static_cast<int>(std::clamp<uint64_t>(sms, 1, static_cast<uint64_t>(device_sms)));
}

}  // namespace tessera
