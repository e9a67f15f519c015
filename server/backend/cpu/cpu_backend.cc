#include "server/backend/cpu/cpu_backend.h"

#include <utility>

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

class CpuContext final : public TenantContext {
 public:
  explicit CpuContext(ContextInfo info) : info_(std::move(info)) {}
  const ContextInfo& info() const override { return info_; }

 private:
  const ContextInfo info_;
};

}  // namespace

CpuBackend::CpuBackend(Options options)
    : options_(std::move(options)),
      devices_{DeviceInfo{.index = 0,
                          .name = absl::StrCat("cpu (", options_.worker_threads, " threads)"),
                          .memory_bytes = options_.memory_bytes,
                          .context_limit = 0,
                          .compute_units = options_.worker_threads}} {}

MpsState CpuBackend::mps() const {
  return MpsState{MpsDecision::kNotApplicable, "MPS does not apply: the CPU backend is serving"};
}

absl::StatusOr<std::unique_ptr<TenantContext>> CpuBackend::CreateContext(
    const ContextRequest& request) {
  if (request.device_index != 0) {
    return absl::InvalidArgumentError(absl::StrCat("device_index is ", request.device_index,
                                                   "; the CPU backend has only device 0"));
  }
  return std::make_unique<CpuContext>(ContextInfo{
      .kind = ContextKind::kCpu,
      .reason = absl::StrCat("CPU backend (", options_.reason,
                             "); compute share is the tenant's weight in the worker pool"),
      .compute_share_enforced = true});
}

uint64_t PhysicalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

}  // namespace tessera
