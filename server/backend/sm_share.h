#ifndef TESSERA_SERVER_BACKEND_SM_SHARE_H_
#define TESSERA_SERVER_BACKEND_SM_SHARE_H_

#include <cstdint>

namespace tessera {

/// The SM count to request for a tenant's MPS client context (execution affinity,
/// CU_EXEC_AFFINITY_TYPE_SM_COUNT) from its compute share: share% of the device's SMs,
/// rounded up so a share never rounds to nothing, clamped to 1..device_sms. The driver then
/// rounds the request up to the nearest SM count the hardware supports (NVIDIA's MPS guide,
/// "programmatic interface"), so the backend records the count the context reports rather
/// than this request. 0 when the device reports no SMs.
int AffinitySmCount(uint32_t share_percent, int device_sms);

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_SM_SHARE_H_
