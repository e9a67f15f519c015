#include "server/backend/backend.h"

namespace tessera {

absl::string_view ContextKindName(ContextKind kind) {
  switch (kind) {
    case ContextKind::kCpu:
      return "CPU";
    case ContextKind::kMps:
      return "MPS";
    case ContextKind::kFallback:
      return "FALLBACK";
    case ContextKind::kGreen:
      return "GREEN";
  }
  return "UNKNOWN";
}

}  // namespace tessera
