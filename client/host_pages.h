#ifndef TESSERA_CLIENT_HOST_PAGES_H_
#define TESSERA_CLIENT_HOST_PAGES_H_

// Large results filled at memory speed: a fresh 256 MiB std::string takes 65536 page faults
// of 4 KiB as it is written, which were most of a download's time on a VM (where a fault
// costs microseconds). Asking for transparent huge pages first makes it 128 (numpy does the
// same for its arrays).
#include <cstdint>
#include <string>

#include <sys/mman.h>

namespace tessera::client_internal {

/// Reserves `bytes` in `*s`; from 4 MiB on, advises the reservation's whole 2 MiB pages
/// MADV_HUGEPAGE before anything touches them. Advice only: where THP is off, nothing changes.
inline void ReserveForFill(std::string* s, size_t bytes) {
  s->reserve(bytes);
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const auto begin = reinterpret_cast<uintptr_t>(s->data());
  const uintptr_t first = (begin + kHuge - 1) / kHuge * kHuge;
  const uintptr_t last = (begin + bytes) / kHuge * kHuge;
  if (last > first) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

}  // namespace tessera::client_internal

#endif  // TESSERA_CLIENT_HOST_PAGES_H_
